"""The synthetic data sets: seeded (own generator), split, shaped as documented, noisy but learnable."""

from __future__ import annotations

import math

import pytest
import torch

from ampkit.errors import UsageError
from ampkit.tasks.synthetic import gaussian_clusters, grating_images, label_noise_floor, marker_sequences

# Small sizes: the properties do not depend on them, and the suite stays fast.
SETS = {
    "gaussian_clusters": lambda **kw: gaussian_clusters(train_size=256, held_size=128, **kw),
    "grating_images": lambda **kw: grating_images(train_size=64, held_size=32, **kw),
    "marker_sequences": lambda **kw: marker_sequences(train_size=256, held_size=128, **kw),
}
SHAPES = {
    "gaussian_clusters": ((128,), torch.float32),
    "grating_images": ((3, 32, 32), torch.float32),
    "marker_sequences": ((32,), torch.int64),
}


def _tensors(data) -> list[torch.Tensor]:
    return [*data.train, *data.held]


@pytest.mark.parametrize("name", SETS)
def test_same_seed_same_tensors_other_seed_others(name):
    a, b, c = SETS[name](data_seed=0), SETS[name](data_seed=0), SETS[name](data_seed=1)
    assert all(torch.equal(x, y) for x, y in zip(_tensors(a), _tensors(b)))
    assert not torch.equal(a.train[0], c.train[0])
    assert not torch.equal(a.held[0], c.held[0])


@pytest.mark.parametrize("name", SETS)
def test_global_rng_is_neither_read_nor_advanced(name):
    before = torch.random.get_rng_state()
    torch.manual_seed(123)
    first = SETS[name](data_seed=0)
    torch.manual_seed(456)  # another global state must not change the data
    second = SETS[name](data_seed=0)
    assert torch.equal(first.train[0], second.train[0])
    torch.random.set_rng_state(before)
    SETS[name](data_seed=0)
    assert torch.equal(torch.random.get_rng_state(), before)


@pytest.mark.parametrize("name", SETS)
def test_shapes_targets_and_splits(name):
    data = SETS[name](data_seed=0)
    shape, dtype = SHAPES[name]
    for inputs, targets in (data.train, data.held):
        assert inputs.shape[1:] == shape and inputs.dtype == dtype
        assert targets.dtype == torch.int64 and targets.shape == (len(inputs),)
        assert int(targets.min()) >= 0 and int(targets.max()) < data.classes
    assert data.classes == 10
    assert len(torch.unique(data.train[1])) == data.classes  # every class is represented
    assert not torch.equal(data.train[0][: len(data.held[0])], data.held[0])  # held out: other rows
    assert data.sizes == {"train_samples": len(data.train[0]), "held_out_samples": len(data.held[0]), "classes": 10}


@pytest.mark.parametrize("name", SETS)
def test_noise_keeps_the_floor_well_above_zero_and_below_chance(name):
    data = SETS[name](data_seed=0)
    assert 0.1 < data.loss_floor < 0.6 * math.log(data.classes)


def test_vector_features_have_about_unit_variance():
    x = gaussian_clusters(data_seed=0).train[0]
    assert abs(float(x.var()) - 1.0) < 0.1


def test_gaussian_floor_falls_with_the_noise():
    floors = [gaussian_clusters(noise=noise, data_seed=0).loss_floor for noise in (2.0, 4.0, 6.0)]
    assert floors[0] < floors[1] < floors[2]
    assert gaussian_clusters(noise=0.0, data_seed=0).loss_floor == 0.0


def test_markers_decide_the_clean_class():
    data = marker_sequences(train_size=64, held_size=8, label_noise=0.0, data_seed=0)
    pairs = torch.combinations(torch.arange(5), 2)
    tokens, targets = data.train
    for row, target in zip(tokens, targets):
        present = sorted(int(t) for t in row if t < 5)
        assert present == pairs[target].tolist()  # exactly the class's two markers, once each
    assert data.loss_floor == 0.0


def test_label_noise_floor():
    assert label_noise_floor(0.0, 10) == 0.0
    assert label_noise_floor(1.0, 10) == pytest.approx(math.log(10))  # labels carry no information
    keep = 0.9 + 0.01
    assert label_noise_floor(0.1, 10) == pytest.approx(-(keep * math.log(keep) + 0.09 * math.log(0.01)))


def test_label_noise_redraws_the_asked_share_of_labels_only():
    clean = marker_sequences(train_size=4000, held_size=1, label_noise=0.0, data_seed=0)
    noisy = marker_sequences(train_size=4000, held_size=1, label_noise=0.3, data_seed=0)
    assert torch.equal(clean.train[0], noisy.train[0])  # the generator draws the same numbers whatever the share
    changed = (clean.train[1] != noisy.train[1]).float().mean()
    assert float(changed) == pytest.approx(0.3 * 0.9, abs=0.03)  # 30% redrawn, 1 in 10 of those lands back


@pytest.mark.parametrize(
    "make, kwargs, argument",
    [
        (gaussian_clusters, {"features": 0}, "features"),
        (gaussian_clusters, {"classes": 1}, "classes"),
        (gaussian_clusters, {"train_size": 0}, "train_size"),
        (gaussian_clusters, {"noise": -1.0}, "noise"),
        (gaussian_clusters, {"noise": float("nan")}, "noise"),
        (grating_images, {"held_size": 2.5}, "held_size"),
        (grating_images, {"image_size": 2}, "image_size"),
        (grating_images, {"label_noise": 1.5}, "label_noise"),
        (marker_sequences, {"markers": 1}, "markers"),
        (marker_sequences, {"vocab_size": 5}, "vocab_size"),
        (marker_sequences, {"seq_len": 1}, "seq_len"),
        (marker_sequences, {"train_size": True}, "train_size"),
    ],
)
def test_bad_arguments_are_one_line_usage_errors(make, kwargs, argument):
    with pytest.raises(UsageError) as err:
        make(**kwargs)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{argument} must be")
