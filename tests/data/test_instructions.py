"""`--data` by content: chat, prompt/completion and text .jsonl; bad records are one line with file and line."""

from __future__ import annotations

import json

import pytest

from ampkit.data import ByteTokenizer, Corpus, InstructionSet, chat_template_for, encode_sample, load_data
from ampkit.data.batching import IGNORE_INDEX
from ampkit.data.instructions import Conversation, PromptCompletion
from ampkit.errors import UsageError
from instruction_fixtures import conversation, write_jsonl

BUILTIN = chat_template_for(ByteTokenizer())


def test_each_format_is_found_by_content(tmp_path, chat_file, prompt_completion_file):
    chat = load_data(chat_file)
    assert isinstance(chat, InstructionSet) and chat.format == "chat" and len(chat.examples) == 24
    assert isinstance(chat.examples[0], Conversation) and chat.examples[0].where == f"{chat_file} line 1"
    pc = load_data(prompt_completion_file)
    assert pc.format == "prompt-completion" and isinstance(pc.examples[3], PromptCompletion)
    text = load_data(write_jsonl(tmp_path / "t.jsonl", [{"body": "one"}, {"body": "two"}]), text_field="body")
    assert isinstance(text, Corpus) and text.format == "text" and text.documents == ("one", "two")


def test_a_prompt_completion_trains_the_completion_and_the_eos():
    example = PromptCompletion(prompt="Q: 2+2? A: ", completion="4", where="f line 1")
    sample = example.render(BUILTIN, completion_only=True)  # the byte tokenizer has no EOS
    encoded = encode_sample(ByteTokenizer(), sample)
    assert ByteTokenizer().decode(encoded.ids[encoded.labels != IGNORE_INDEX].tolist()) == "4"
    assert example.render(BUILTIN, completion_only=False).spans is None


def test_conversational_prompt_completion_is_a_conversation(tmp_path):
    messages = conversation(1)
    record = {"prompt": messages[:2], "completion": messages[2:3]}
    data = load_data(write_jsonl(tmp_path / "c.jsonl", [record]))
    assert data.examples[0] == Conversation(messages=tuple(messages[:3]), where=f"{tmp_path / 'c.jsonl'} line 1")


def test_train_on_all_trains_the_whole_conversation_and_text_refuses_completion(chat_file, tmp_path):
    samples = load_data(chat_file).samples(BUILTIN, train_on="all")
    assert all(s.spans is None for s in samples)
    text = load_data(write_jsonl(tmp_path / "t.jsonl", [{"text": "one"}]))
    with pytest.raises(UsageError, match="--train-on completion needs instruction data"):
        text.samples(None, train_on="completion")


def _error(tmp_path, lines: list[str], **kw) -> str:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(UsageError) as info:
        data = load_data(path)
        data.samples(BUILTIN, **kw)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    return message


CHAT = json.dumps({"messages": conversation(1)})


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([CHAT, '{"messages": [oops]}'], "line 2 is not valid JSON"),
        ([CHAT, json.dumps({"body": "x"})], "line 2 has no 'messages', prompt/completion or string \"text\""),
        ([CHAT, json.dumps({"text": "x"})], "line 2 is a text record but line 1 is chat"),
        ([json.dumps({"messages": [{"role": "robot", "content": "x"}]})], "line 1: message 1 has the unknown role"),
        ([json.dumps({"messages": [{"role": "user"}]})], 'line 1: message 1 needs a string "content"'),
        ([json.dumps({"messages": []})], 'line 1: "messages" must be a non-empty list'),
        ([json.dumps({"prompt": "p", "completion": 3})], 'line 1: "prompt" and "completion" must both be strings'),
        ([json.dumps({"prompt": "p", "completion": " "})], 'line 1: the "completion" is empty'),
    ],
)
def test_bad_records_name_the_file_and_line(tmp_path, lines, expected):
    assert expected in _error(tmp_path, lines, train_on="auto")


def test_a_conversation_without_an_answer_is_refused_only_under_completion(tmp_path):
    record = json.dumps({"messages": [{"role": "user", "content": "hello?"}]})
    assert "line 2: the conversation has no assistant turn" in _error(tmp_path, [CHAT, record], train_on="completion")
    path = write_jsonl(tmp_path / "ok.jsonl", [json.loads(CHAT), json.loads(record)])
    assert len(load_data(path).samples(BUILTIN, train_on="all")) == 2
