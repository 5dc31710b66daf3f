"""attnlab stream: rolling-cache perplexity on a long text against the recomputed sliding window
and dense attention within the block; each quantity checked against a direct recompute of the
same context (a tiny random model in float64), and the command's bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.inference import stream
from attnlab.model.gpt import GPT, GPTConfig

BLOCK, C = 12, 6


def tiny_model(n_layer: int = 1, **kw) -> GPT:
    """Every parameter drawn at std 0.5, so a wrong context or position changes the logits."""
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=13, block_size=BLOCK, n_layer=n_layer, n_head=4, d_model=16, **{"pos_encoding": "rope", **kw}
    )
    model = GPT(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            nn.init.normal_(p, std=0.5)
    return model


def text(n: int = 40) -> torch.Tensor:
    return torch.randint(0, 13, (n,), generator=torch.Generator().manual_seed(1))


def direct_nll(model: GPT, ids: torch.Tensor, t: int, context: torch.Tensor) -> float:
    with torch.no_grad():
        logits = model(context.unsqueeze(0))[0][0, -1]
    return float(F.cross_entropy(logits, ids[t + 1]))


def kept(ids: torch.Tensor, t: int, sinks: int) -> torch.Tensor:
    """What a rolling cache holds after ids[0..t]: the first sinks tokens and the most recent ones."""
    if t + 1 <= C:
        return ids[: t + 1]
    return torch.cat([ids[:sinks], ids[t + 1 - (C - sinks) : t + 1]])


@pytest.mark.parametrize("sinks", [0, 1, 2])
@pytest.mark.parametrize("pos", ["rope", "alibi", "none"])
def test_rolling_nll_is_a_direct_recompute_over_the_kept_tokens(sinks, pos):
    """One layer: keys and values depend on their own token only, so each position's NLL is a full
    forward's over the sinks and the most recent tokens."""
    model, ids = tiny_model(pos_encoding=pos), text()
    got = stream.rolling_nll(model, ids, C, sinks)
    want = [direct_nll(model, ids, t, kept(ids, t, sinks)) for t in range(len(ids) - 1)]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-10, rtol=0)


@pytest.mark.parametrize("n_layer", [1, 2])
def test_oracle_and_dense_are_direct_recomputes(n_layer):
    model, ids = tiny_model(n_layer), text()
    positions = list(range(len(ids) - 1))
    oracle = stream.window_nll(model, ids, C, positions, batch=5)
    want = [direct_nll(model, ids, t, ids[max(0, t + 1 - C) : t + 1]) for t in positions]
    torch.testing.assert_close(oracle, torch.tensor(want, dtype=torch.float64), atol=1e-10, rtol=0)
    dense = stream.dense_nll(model, ids)
    want = [direct_nll(model, ids, t, ids[t - t % BLOCK : t + 1]) for t in positions]
    torch.testing.assert_close(dense, torch.tensor(want, dtype=torch.float64), atol=1e-10, rtol=0)
    rolling = stream.rolling_nll(model, ids, C, 0)
    torch.testing.assert_close(rolling[:C], oracle[:C], atol=1e-10, rtol=0)  # the same until the first eviction
    if n_layer == 1:  # without sinks one layer's rolling cache holds exactly the oracle's window
        torch.testing.assert_close(rolling, oracle, atol=1e-10, rtol=0)
    else:  # deeper layers' entries keep the context they were computed in
        assert (rolling[C:] - oracle[C:]).abs().max() > 1e-6


def test_report_uses_the_same_positions_for_every_arm():
    model, ids = tiny_model(2), text(41)
    report = stream.stream_report(model, ids, C, [0, 2], oracle_limit=7)
    positions = stream.oracle_positions(len(ids), 7)
    assert report["oracle"]["positions"] == len(positions) <= 7 and positions[-1] == len(ids) - 2
    assert all(b - a == report["oracle"]["stride"] for a, b in zip(positions, positions[1:]))
    at = torch.tensor(positions)
    oracle = stream.window_nll(model, ids, C, positions)
    assert report["oracle"]["ppl"] == pytest.approx(float(oracle.exp().prod() ** (1 / len(positions))), rel=1e-9)
    for row in report["rolling"]:
        nll = stream.rolling_nll(model, ids, C, row["sinks"])
        assert row["ppl"] == pytest.approx(float(torch.exp(nll.mean())), rel=1e-12)
        assert row["ppl_oracle_positions"] == pytest.approx(float(torch.exp(nll[at].mean())), rel=1e-12)
    assert report["evicting_positions"] == len(ids) - 1 - C


def test_the_recorded_writes_are_the_attention_outputs_a_direct_forward_gives():
    """One layer: a position's attention output depends on the tokens the cache holds, so the write norm
    recorded at step t is that of the attention block's output at the last position of a full forward
    over the kept tokens; before the first eviction every kept count writes the same."""
    model, ids = tiny_model(), text()
    outputs = []
    handle = model.blocks[0].attn.register_forward_hook(lambda _m, _i, y: outputs.append(y[0, -1].norm()))
    for sinks in (0, 2):
        nll, writes = stream.rolling_decode(model, ids, C, sinks)
        torch.testing.assert_close(nll, stream.rolling_nll(model, ids, C, sinks), atol=0, rtol=0)
        for t in (0, C - 1, C, len(ids) - 2):
            outputs.clear()
            with torch.no_grad():
                model(kept(ids, t, sinks).unsqueeze(0))
            assert float(writes[t, 0]) == pytest.approx(float(outputs[0]), rel=1e-9)
    handle.remove()
    first, other = stream.rolling_decode(model, ids, C, 0)[1], stream.rolling_decode(model, ids, C, 2)[1]
    torch.testing.assert_close(first[:C], other[:C], atol=0, rtol=0)
    assert (first[C:] - other[C:]).abs().max() > 1e-6


def test_by_class_reads_only_the_positions_past_the_first_eviction():
    nll = torch.arange(1, 11, dtype=torch.float64) / 10
    writes = torch.arange(10, dtype=torch.float64).unsqueeze(1).repeat(1, 2)
    even = torch.arange(11) % 2 == 0  # masks over the N ids, one longer than the N - 1 predictions
    masks = {name: stream.past_eviction(m[None], 10, 4) for name, m in {"even": even, "odd": ~even}.items()}
    out = stream.by_class(nll, writes, masks)
    assert out["even"]["positions"] == 3 and out["odd"]["positions"] == 3  # 4, 6, 8 and 5, 7, 9
    assert out["even"]["write_norm"] == [6.0, 6.0] and out["odd"]["write_norm"] == [7.0, 7.0]
    assert out["even"]["ppl"] == pytest.approx(float(torch.exp(nll[[4, 6, 8]].mean())))


def test_several_sequences_pool_every_position_into_one_perplexity():
    """(S, N) ids: each perplexity is exp of the mean NLL over all S x (N - 1) positions, i.e. the geometric
    mean of the sequences' own perplexities (equal lengths), and a class mask counts each sequence's
    positions past its own first eviction."""
    model = tiny_model(2)
    seqs = torch.stack([torch.randint(0, 13, (31,), generator=torch.Generator().manual_seed(s)) for s in (1, 2, 3)])
    classes = {"even": seqs % 2 == 0, "odd": seqs % 2 == 1}
    pooled = stream.stream_report(model, seqs, C, [0, 2], oracle_limit=7, classes=classes)
    alone = [
        stream.stream_report(model, s, C, [0, 2], oracle_limit=7, classes={k: m[i] for k, m in classes.items()})
        for i, s in enumerate(seqs)
    ]
    assert pooled["sequences"] == 3 and pooled["tokens"] == 31 and pooled["positions"] == 90
    assert pooled["evicting_positions"] == sum(a["evicting_positions"] for a in alone) == 3 * (30 - C)
    assert pooled["oracle"]["positions"] == 3 * alone[0]["oracle"]["positions"]

    def geometric(values):
        return float(torch.tensor(values, dtype=torch.float64).log().mean().exp())

    for i, row in enumerate(pooled["rolling"]):
        nll = torch.cat([stream.rolling_nll(model, s, C, row["sinks"]) for s in seqs])
        assert row["ppl"] == pytest.approx(float(torch.exp(nll.mean())), rel=1e-12)
        assert row["ppl"] == pytest.approx(geometric([a["rolling"][i]["ppl"] for a in alone]), rel=1e-12)
        assert row["ppl_oracle_positions"] == pytest.approx(
            geometric([a["rolling"][i]["ppl_oracle_positions"] for a in alone]), rel=1e-12
        )
        for name, c in row["classes"].items():
            assert c["positions"] == sum(a["rolling"][i]["classes"][name]["positions"] for a in alone)
        assert sum(c["positions"] for c in row["classes"].values()) == pooled["evicting_positions"]
    assert pooled["oracle"]["ppl"] == pytest.approx(geometric([a["oracle"]["ppl"] for a in alone]), rel=1e-12)
    assert pooled["dense"]["ppl"] == pytest.approx(geometric([a["dense"]["ppl"] for a in alone]), rel=1e-12)
    # one sequence given as (N,) or as (1, N) is the same report
    assert stream.stream_report(model, seqs[0], C, [0]) == stream.stream_report(model, seqs[:1], C, [0])


# ------------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two 2-step runs of block 16: rope and learned positions."""
    from attnlab.config.compose import compose_config
    from attnlab.training.train import train

    out = {}
    for pos in ("rope", "learned"):
        cfg = compose_config(
            [
                "debug=smoke",
                "logger=none",
                "trainer.max_steps=2",
                "model.n_layer=1",
                "model.d_model=32",
                "model.n_head=2",
                "model.block_size=16",
                f"model.pos_encoding={pos}",
            ],
            tmp_path_factory.mktemp(pos),
        )
        train(cfg)
        out[pos] = Path(cfg.paths.output_dir)
    return out


def test_stream_json_on_a_text_file_and_the_validation_split(runs, tmp_path, capsys):
    corpus = tmp_path / "long.txt"
    corpus.write_text("To be, or not to be, that is the question:\n" * 8)
    stream.main([str(runs["rope"]), "--cache", "8", "--sinks", "0,2", "--text", str(corpus), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == len(corpus.read_text()) and report["capacity"] == 8 and report["block_size"] == 16
    assert [r["sinks"] for r in report["rolling"]] == [0, 2]
    assert report["oracle"]["positions"] == report["positions"] == report["tokens"] - 1  # under the default bound
    # one layer, no sinks: the rolling cache is the recomputed window, on the same tokens
    assert report["rolling"][0]["ppl"] == pytest.approx(report["oracle"]["ppl"], rel=1e-4)
    stream.main([str(runs["rope"]), "--cache", "16", "--tokens", "100", "--oracle-positions", "10", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == 100 and report["oracle"]["positions"] <= 10
    assert [r["sinks"] for r in report["rolling"]] == [0, 1, 2, 4]
    assert all(1 < r["ppl"] < 1e4 for r in report["rolling"])
    # --sequences: consecutive stretches of the text, pooled; the first is the single-sequence text
    stream.main([str(runs["rope"]), "--cache", "8", "--sinks", "0", "--text", str(corpus), "--tokens", "60", "--json"])
    one = json.loads(capsys.readouterr().out)
    args = ["--cache", "8", "--sinks", "0", "--text", str(corpus), "--tokens", "60", "--sequences", "3", "--json"]
    stream.main([str(runs["rope"]), *args])
    three = json.loads(capsys.readouterr().out)
    assert three["sequences"] == 3 and three["tokens"] == 60 and three["positions"] == 3 * 59
    assert three["source"].startswith("3 consecutive stretches") and one["sequences"] == 1
    assert three["rolling"][0]["ppl"] != pytest.approx(one["rolling"][0]["ppl"], rel=1e-9)


@pytest.mark.parametrize(
    "key,args,code",
    [
        ("missing", ["--cache", "8"], 1),
        ("rope", ["--cache", "17"], 1),  # C above the block
        ("rope", ["--cache", "8", "--sinks", "8"], 2),  # k >= C
        ("rope", ["--cache", "8", "--sinks", "a,1"], 2),
        ("rope", ["--cache", "0"], 2),
        ("rope", ["--cache", "8", "--tokens", "0"], 2),
        ("rope", ["--cache", "8", "--sequences", "0"], 2),
        ("rope", ["--cache", "8", "--tokens", "100", "--sequences", "100000"], 1),  # more than the split holds
        ("rope", ["--cache", "8", "--text", "nowhere.txt"], 1),
        ("learned", ["--cache", "8"], 1),  # learned positions take no rolling cache
    ],
)
def test_bad_input_is_one_line_and_a_nonzero_exit(runs, key, args, code, tmp_path, capsys):
    run = str(runs.get(key, tmp_path / "no_such_run"))
    with pytest.raises(SystemExit) as err:
        stream.main([run, *args])
    message = str(err.value.code) if err.value.code not in (1, 2) else capsys.readouterr().err.splitlines()[-1]
    assert (1 if not isinstance(err.value.code, int) else err.value.code) == code
    assert message.startswith("attnlab: error: ") and "\n" not in message and "expected" in message
