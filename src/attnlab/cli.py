"""``attnlab <command>``: the one console script; each command is a module's own entry point.

``attnlab train`` takes Hydra overrides exactly as ``python -m attnlab.training.train`` does; the other
commands take ``--options`` (and the run or sweep dir they act on as a positional argument),
parsed by `attnlab.util.cli.command_parser`, so every command reports bad input as one
``attnlab: error: ...`` line and exit code 2.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

from attnlab.util.cli import ERROR_PREFIX

# command -> (module, entry function, one-line help). Modules are imported only when run.
COMMANDS = {
    "train": (
        "attnlab.training.train",
        "main",
        "train one model; Hydra overrides, e.g. attention=sdpa model.d_k=64 (-m: multirun)",
    ),
    "sweep": (
        "attnlab.sweeps.sweep",
        "main",
        "run a study as a Hydra multirun, then its table (--study, --seeds, --jobs; --launcher slurm)",
    ),
    "plan": (
        "attnlab.sweeps.plan",
        "main",
        "a study's seeds and hours from its runs before the compute -> reports/<study>/plan.md (--pilot, --hours)",
    ),
    "report": (
        "attnlab.studies.report.__main__",
        "main",
        "aggregate a sweep dir into reports/<study>/ (default: the latest)",
    ),
    "repro": (
        "attnlab.repro.__main__",
        "cli",
        "reproduce and check the source articles' claims (--mode fast|full)",
    ),
    "bench": ("attnlab.tools.bench.__main__", "main", "kernel, memory and training-throughput benchmarks (--mode)"),
    "sample": ("attnlab.inference.sample", "main", "generate text from a run's checkpoint (default: the latest run)"),
    "analyze": ("attnlab.inference.analyze", "main", "head scores and head types of a run dir or checkpoint"),
    "dashboard": (
        "attnlab.tools.dashboard",
        "main",
        "create a saved W&B workspace (prints the plan when not logged in)",
    ),
    "gpu-check": (
        "attnlab.tools.gpu_check",
        "main",
        "every backend x precision x qk_norm on the GPU, DDP, kernels -> reports/gpu/",
    ),
    "prepare": (
        "attnlab.data.prepare",
        "main",
        "tokenize a text corpus into train.bin / val.bin for data=tokens (a BPE trained on it, or --encoding gpt2)",
    ),
    "stream": (
        "attnlab.inference.stream",
        "main",
        "perplexity of a run decoded with rolling KV caches (--cache C --sinks K,...) against the recomputed window",
    ),
    "stream-study": (
        "attnlab.studies.stream_study",
        "main",
        "every run of a sweep decoded with rolling KV caches: what dropping the first tokens costs -> reports/<study>/",
    ),
    "sink-search": (
        "attnlab.studies.sink_search",
        "main",
        "does a head of a text model put 0.3 of its weight on the first token? runs and text studies -> reports/text_sinks/",
    ),
    "export": (
        "attnlab.inference.export",
        "main",
        "write a run's model as a Hugging Face dir (--format hf): GPT-2, Llama or DeepSeek-V3, loadable offline by transformers",
    ),
    "render": (
        "attnlab.tools.render",
        "main",
        "every page and figure under reports/ again from its committed data (--check: orphans and stale pages)",
    ),
    "verify": (
        "attnlab.studies.verify",
        "main",
        "train committed rows of reports/<study>/runs.csv again and compare them bit for bit (--seeds, --stamp)",
    ),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return (
        "usage: attnlab COMMAND [ARGS...]\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\n`attnlab COMMAND --help` shows a command's options."
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"{ERROR_PREFIX}unknown command {command!r}; expected one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module, function, _ = COMMANDS[command]
    entry = getattr(importlib.import_module(module), function)
    if command == "train":  # Hydra reads sys.argv itself
        sys.argv = [sys.argv[0], *rest]
        # Lightning starts DDP ranks as `python -m <__main__'s module> sys.argv[1:]`: make that attnlab.training.train
        import __main__

        __main__.__spec__ = importlib.util.find_spec("attnlab.training.train")
        entry()
        return 0
    return entry(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
