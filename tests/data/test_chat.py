"""Chat templates: the text is transformers' own, the loss spans are the assistant turns."""

from __future__ import annotations

import json
import shutil

import pytest

from ampkit.data import BUILTIN_CHAT_TEMPLATE, IGNORE_INDEX, ByteTokenizer, chat_template_for, encode_sample
from ampkit.data.chat import JinjaTemplate, render_conversation, saved_chat_template
from ampkit.data.hf_tokenizer import load_hf_tokenizer
from ampkit.errors import UsageError
from instruction_fixtures import CHATML, conversation


def _trained_text(tokenizer, sample) -> str:
    encoded = encode_sample(tokenizer, sample)
    return tokenizer.decode(encoded.ids[encoded.labels != IGNORE_INDEX].tolist())


def test_an_hf_template_renders_as_apply_chat_template_and_trains_the_answers(bpe_model_dir):
    tokenizer = load_hf_tokenizer(bpe_model_dir)
    template = chat_template_for(tokenizer)
    messages = conversation(7)
    sample = render_conversation(template, messages, where="x line 1", completion_only=True)
    hf = tokenizer.tokenizer
    assert sample.text == hf.apply_chat_template(messages, tokenize=False)
    encoded = encode_sample(tokenizer, sample)
    assert encoded.ids.tolist() == list(hf.apply_chat_template(messages, tokenize=True)["input_ids"])
    assert _trained_text(tokenizer, sample) == "14.<|im_end|>\nYes.<|im_end|>\n"  # answers and their end marker


def test_the_template_is_read_from_chat_template_jinja_too(bpe_model_dir, tmp_path):
    folder = tmp_path / "new-layout"
    shutil.copytree(bpe_model_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    marked = CHATML.replace("'<|im_start|>' + message['role']", "'<|im_start|>' + message['role'] + ':'")
    (folder / "chat_template.jinja").write_text(marked)
    assert saved_chat_template(folder) == marked
    sample = render_conversation(
        chat_template_for(load_hf_tokenizer(folder)), conversation(1), where="x", completion_only=False
    )
    assert sample.text.startswith("<|im_start|>system:\n") and sample.spans is None


def test_a_chat_template_file_overrides_the_tokenizers(bpe_model_dir, tmp_path):
    path = tmp_path / "plain.jinja"
    path.write_text(
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    tokenizer = load_hf_tokenizer(bpe_model_dir)
    sample = render_conversation(
        chat_template_for(tokenizer, str(path)), conversation(2), where="x", completion_only=True
    )
    assert sample.text.startswith("[system] Be brief.\n[user] 2+2?\n[assistant] 4.\n")
    assert [sample.text[a:b] for a, b in sample.spans] == ["4.\n", "Yes.\n"]


def test_the_byte_tokenizers_builtin_template():
    template = chat_template_for(ByteTokenizer())
    assert isinstance(template, JinjaTemplate) and template.source == BUILTIN_CHAT_TEMPLATE
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    sample = render_conversation(template, messages, where="x", completion_only=True)
    assert sample.text == "<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
    assert _trained_text(ByteTokenizer(), sample) == "Hello!<|end|>\n"


def test_a_template_that_rewrites_earlier_turns_is_refused():
    # Drops every assistant turn but the last: a prefix renders differently inside the whole.
    source = (
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
        "{{ m['role'] }}: {{ m['content'] }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    with pytest.raises(UsageError, match="f.jsonl line 3: chat template t renders the first turns differently"):
        render_conversation(
            JinjaTemplate(source, name="t"), conversation(1), where="f.jsonl line 3", completion_only=True
        )


def test_a_template_that_raises_names_the_record():
    source = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(UsageError, match=r"^f.jsonl line 2: .*roles must alternate") as info:
        render_conversation(
            JinjaTemplate(source, name="t"), conversation(1), where="f.jsonl line 2", completion_only=False
        )
    assert "\n" not in str(info.value)


def test_a_tokenizer_without_a_template_says_how_to_give_one(bpe_model_dir, tmp_path):
    folder = tmp_path / "no-template"
    shutil.copytree(bpe_model_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match="has no chat template.*--chat-template FILE.jinja"):
        chat_template_for(load_hf_tokenizer(folder))
