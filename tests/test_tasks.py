"""The generated tasks: structure promised in their docstrings, seeds, disjoint splits, errors."""

import pytest
import torch

from attnlab.config.compose import compose_config
from attnlab.data.tasks import IGNORE, InductionDataModule, MQARDataModule
from attnlab.util.errors import DataError


def batches(loader, n=None):
    out = []
    for i, batch in enumerate(loader):
        if n is not None and i >= n:
            break
        out.append(batch)
    return out


def lookup_answers(x: torch.Tensor, y: torch.Tensor, n_pairs: int) -> torch.Tensor:
    """Solve MQAR by lookup: the value after the query key's occurrence among the pairs."""
    pred = torch.full_like(y, IGNORE)
    for b, t in (y != IGNORE).nonzero().tolist():
        pairs = x[b, : 2 * n_pairs]
        hits = (pairs[0::2] == x[b, t]).nonzero()
        assert len(hits) == 1, "each queried key occurs exactly once among the pairs"
        pred[b, t] = pairs[2 * int(hits[0]) + 1]
    return pred


@pytest.fixture
def mqar():
    dm = MQARDataModule(vocab_size=32, num_pairs=6, block_size=32, batch_size=16, steps=20, val_batches=4, seed=3)
    dm.setup("fit")
    return dm


def test_mqar_lookup_solves_every_answer(mqar):
    for x, y in batches(mqar.train_dataloader(), 5) + batches(mqar.val_dataloader()):
        assert x.shape == y.shape == (16, 32)
        scored = y != IGNORE
        assert (scored.sum(1) == 6).all()  # every pair queried once
        pred = lookup_answers(x, y, 6)
        assert torch.equal(pred[scored], y[scored])


def test_mqar_token_roles(mqar):
    x, y = next(iter(mqar.val_dataloader()))
    k = mqar.n_keys
    keys, values = x[:, 0:12:2], x[:, 1:12:2]
    assert ((keys >= 1) & (keys <= k)).all() and ((values > k) & (values < 32)).all()
    assert all(len(set(row.tolist())) == 6 for row in keys)  # keys distinct within a sequence
    answers = y[y != IGNORE]
    assert ((answers > k) & (answers < 32)).all()
    assert mqar.vocab()[0] == "_" and len(mqar.vocab()) == mqar.vocab_size == 32


def test_task_data_is_a_function_of_the_seed_and_train_val_disjoint(mqar):
    again = MQARDataModule(vocab_size=32, num_pairs=6, block_size=32, batch_size=16, steps=20, val_batches=4, seed=3)
    again.setup("fit")
    assert torch.equal(mqar.train_set[7][0], again.train_set[7][0])
    other = MQARDataModule(vocab_size=32, num_pairs=6, block_size=32, batch_size=16, steps=20, val_batches=4, seed=4)
    other.setup("fit")
    assert not torch.equal(mqar.train_set[7][0], other.train_set[7][0])
    val = {tuple(row.tolist()) for x, _ in batches(mqar.val_dataloader()) for row in x}
    train = {tuple(row.tolist()) for x, _ in batches(mqar.train_dataloader()) for row in x}
    assert val and train and not (val & train)


def test_disjointness_is_enforced_not_just_likely():
    # two symbols, [bos a b a b]: only 4 distinct sequences exist, so clashes with validation are certain
    dm = InductionDataModule(
        vocab_size=3,
        seq_len=4,
        block_size=4,
        batch_size=4,
        steps=5,
        val_batches=1,
        seed=0,
        min_half=2,
        max_half=2,
        distinct=False,
    )
    dm.setup("fit")
    val = {tuple(r.tolist()) for r in dm.val_set.sequences(0)[0]}
    for i in range(5):
        seq, _ = dm.train_set.sequences(i)
        assert not ({tuple(r.tolist()) for r in seq} & val)


def test_induction_structure():
    dm = InductionDataModule(vocab_size=64, block_size=32, batch_size=16, steps=4, val_batches=2, seed=1)
    dm.setup("fit")
    halves, ends = set(), set()
    for x, y in batches(dm.train_dataloader()) + batches(dm.val_dataloader()):
        assert x.shape == (16, 32) and (x[:, 0] == 0).all()  # <bos>
        for xs, targets in zip(x, y):
            full = torch.cat([xs, targets[-1:]])  # the whole sequence if the last target is scored
            scored = (targets != IGNORE).nonzero().flatten()
            first, last = int(scored[0]), int(scored[-1])
            half = last - first + 2
            assert torch.equal(scored, torch.arange(first, last + 1))  # one contiguous run
            assert 8 <= half <= 16
            second = full[first : first + half]
            assert torch.equal(full[first - half : first], second)  # an exact repeat
            assert torch.equal(targets[scored], second[1:])  # scored from the second repeated token on
            once = torch.cat([xs[1:first], xs[first + half :]])  # prefix, r, suffix (as far as x holds it)
            assert len(set(once.tolist())) == len(once) >= 31 - half  # no token twice outside the repeat
            halves.add(half)
            ends.add(first + half)
    assert len(halves) > 3  # L varies, so no fixed offset solves it
    assert len(ends) > 3  # and so does where the repeat ends: no position-only shortcut


def test_induction_probe_has_no_repeats():
    dm = InductionDataModule(vocab_size=64, block_size=32, seed=1)
    dm.setup("fit")
    probe = dm.probe_batch(4)
    assert probe.shape == (4, 32) and (probe[:, 0] == 0).all()
    assert all(len(set(row.tolist())) == 32 for row in probe)


@pytest.mark.parametrize(
    "make, key",
    [
        (lambda: MQARDataModule(vocab_size=64, num_pairs=8, seq_len=128, block_size=64), "data.seq_len"),
        (lambda: MQARDataModule(vocab_size=9, num_pairs=5, block_size=64), "data.num_pairs"),
        (lambda: MQARDataModule(vocab_size=64, num_pairs=8, block_size=16), "data.seq_len"),
        (lambda: InductionDataModule(vocab_size=16, block_size=64), "data.vocab_size"),
        (lambda: InductionDataModule(vocab_size=64, min_half=40, block_size=64), "data.min_half"),
    ],
)
def test_bad_settings_fail_with_one_line_naming_the_key(make, key):
    with pytest.raises(DataError) as err:
        make()
    assert key in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("data", ["mqar", "induction"])
def test_data_configs_instantiate_like_train_does(data, tmp_path):
    from hydra.utils import instantiate

    cfg = compose_config([f"data={data}"], tmp_path)
    dm = instantiate(cfg.data, block_size=cfg.model.block_size, steps=3, seed=cfg.seed)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (cfg.data.batch_size, cfg.model.block_size) and (y != IGNORE).any()
    dm.tokenizer.save(tmp_path / "vocab.json")
    assert (tmp_path / "vocab.json").read_text().count('"') > 2 * dm.vocab_size


def test_text_windows_start_with_bos_when_asked(tmp_path):
    from attnlab.data import TextDataModule

    path = tmp_path / "t.txt"
    path.write_text("the cat sat on the mat; " * 40)
    plain = TextDataModule(source="textfile", path=str(path), block_size=16, batch_size=4, steps=3, val_batches=2)
    with_bos = TextDataModule(
        source="textfile", path=str(path), block_size=16, batch_size=4, steps=3, val_batches=2, bos=True
    )
    for dm in (plain, with_bos):
        dm.setup("fit")
    assert with_bos.vocab() == [*plain.vocab(), "<bos>"] and with_bos.vocab_size == plain.vocab_size + 1
    bos = with_bos.vocab_size - 1
    text = "".join(plain.vocab()[int(i)] for i in plain.train_ids)
    for x, y in batches(with_bos.train_dataloader()) + batches(with_bos.val_dataloader()):
        assert x.shape == y.shape == (4, 16) and (x[:, 0] == bos).all() and not (x[:, 1:] == bos).any()
        assert torch.equal(x[:, 1:], y[:, :-1])  # next-token targets, the first one read from BOS alone
        assert all(with_bos.tokenizer.decode(row) in text + text for row in y[:1])
    x, y = next(iter(plain.train_dataloader()))
    assert not (x == bos).any() and torch.equal(x[:, 1:], y[:, :-1])
    assert (with_bos.probe_batch(3)[:, 0] == bos).all()


def test_mqar_with_bos_puts_it_first_and_keeps_every_answer_solvable():
    dm = MQARDataModule(
        vocab_size=32, num_pairs=6, block_size=32, batch_size=8, steps=3, val_batches=2, seed=3, bos=True
    )
    dm.setup("fit")
    assert dm.vocab_size == 33 and dm.vocab()[-1] == "<bos>"
    for x, y in batches(dm.train_dataloader()) + batches(dm.val_dataloader()):
        assert (x[:, 0] == 32).all() and not (x[:, 1:] == 32).any()
        scored = y != IGNORE
        assert (scored.sum(1) == 6).all() and not scored[:, 0].any()
        pred = lookup_answers(x[:, 1:], y[:, 1:], 6)
        assert torch.equal(pred[scored[:, 1:]], y[:, 1:][scored[:, 1:]])


def test_induction_refuses_bos_false_in_one_line():
    with pytest.raises(DataError, match="data.bos=false.*expected true") as err:
        InductionDataModule(vocab_size=64, block_size=32, bos=False)
    assert "\n" not in str(err.value)


def test_induction_gap_separates_the_copies_by_a_varying_distance():
    dm = InductionDataModule(
        vocab_size=64, block_size=48, batch_size=32, steps=2, val_batches=1, seed=2, min_half=6, max_half=10, max_gap=20
    )
    dm.setup("fit")
    distances = set()
    for x, y in batches(dm.train_dataloader()):
        for xs, targets in zip(x, y):
            full = torch.cat([xs, targets[-1:]])
            scored = (targets != IGNORE).nonzero().flatten()
            first, last = int(scored[0]), int(scored[-1])
            half = last - first + 2
            assert 6 <= half <= 10 and torch.equal(scored, torch.arange(first, last + 1))
            second = full[first : first + half]
            # the first copy: the only earlier place where the second copy's tokens occur in order
            starts = [s for s in range(1, first - half + 1) if torch.equal(full[s : s + half], second)]
            assert len(starts) == 1
            gap = first - (starts[0] + half)
            assert 0 <= gap <= 20
            assert torch.equal(targets[scored], second[1:])
            distances.add(half - 1 + gap)  # from a query to its answer
    assert max(distances) - min(distances) > 15  # the answer is not at a fixed band of distances
    with pytest.raises(DataError, match="data.max_gap"):
        InductionDataModule(vocab_size=64, block_size=48, max_gap=-1)


def test_the_attention_free_level_of_a_task_is_what_the_current_token_tells():
    """MQAR's answers are values drawn uniformly and independently of their key, so a model that sees only the
    current token reaches ln(#values) and no lower; the induction repeat is uniform over the non-<bos> tokens;
    on Bigram-Backcopy the current token is most of the answer, so the bigram level lies far below the unigram."""
    import math

    from attnlab.studies.report.baseline import experiment_baseline, task_levels

    mqar = {"_target_": "attnlab.data.tasks.MQARDataModule", "vocab_size": 64, "num_pairs": 8, "batch_size": 64}
    level = task_levels(mqar, block_size=64)
    n_values = 64 - 1 - MQARDataModule(vocab_size=64, num_pairs=8).n_keys
    assert level["bigram"] == pytest.approx(math.log(n_values), abs=0.02)
    induction = {"_target_": "attnlab.data.tasks.InductionDataModule", "vocab_size": 32, "distinct": False}
    assert task_levels(induction, block_size=64)["bigram"] == pytest.approx(math.log(31), abs=0.02)
    bb = experiment_baseline("sinks_bb")
    assert bb["source"].endswith("task_levels") and bb["bigram"] < bb["unigram"] - 1.0
