"""Checkpoints that survive being killed mid-write, that are checked before use, and the state
needed to resume bit for bit.

Lightning's TorchCheckpointIO writes the target file in place, so a kill during a save leaves a
truncated ``last.ckpt``. ``AtomicCheckpointIO`` writes to a temp file in the same directory, fsyncs
it and renames it over the target: a reader sees the old checkpoint or the new one, never half.
A save that fails (full disk, no permission) says so in one line and leaves the old file in place.

A file damaged some other way (a copy cut short, a failing disk) is caught by ``read_checkpoint``
before anything uses it; ``newest_intact`` finds the checkpoint ``resume=true`` falls back to.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from attnlab.interop.hf_load import is_hf_dir, model_from_hf
from attnlab.training.lit_module import GPTModule
from attnlab.util.errors import CheckpointError
from attnlab.util.files import atomic_file, fmt_bytes, write_failure

# what every checkpoint attnlab writes holds (GPTModule's hyper-parameters rebuild the model)
REQUIRED_KEYS = ("state_dict", "hyper_parameters", "global_step")


def tensor_bytes(obj) -> int:
    """Bytes of the tensors in a nested checkpoint dict: about the size of the file it makes."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        try:
            with atomic_file(path, "wb") as f:
                torch.save(checkpoint, f)
        except (OSError, RuntimeError) as err:  # torch's zip writer reports a failed write as RuntimeError
            raise write_failure("checkpoint", Path(path), tensor_bytes(checkpoint), err) from None

    def load_checkpoint(
        self, path, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        # everything attnlab stores is tensors and plain Python values: no pickled objects needed
        return super().load_checkpoint(
            path, map_location=map_location, weights_only=True if weights_only is None else weights_only
        )


class FinalCheckpoint(L.Callback):
    """last.ckpt at the run's last step.

    Lightning's ModelCheckpoint writes last.ckpt at the end only when it has saved nothing before,
    so a max_steps that is not a multiple of checkpoint.every_n_steps would leave last.ckpt (what
    sample and analyze read) up to every_n_steps - 1 steps behind the trained model.
    """

    def __init__(self):
        self.saved_step: int | None = None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.saved_step = checkpoint["global_step"]

    def on_train_end(self, trainer, pl_module) -> None:
        if self.saved_step is None or self.saved_step == trainer.global_step:
            return  # nothing saved yet (ModelCheckpoint saves last.ckpt itself), or already current
        for callback in trainer.checkpoint_callbacks:
            if callback.save_last and callback.dirpath:
                trainer.save_checkpoint(Path(callback.dirpath) / "last.ckpt")


def read_checkpoint(path) -> dict[str, Any]:
    """Load a checkpoint after checking it; CheckpointError says what is wrong with the file.

    The zip archive torch writes stores a CRC32 per member: ``testzip`` reads them all, so a flipped
    byte is caught too (torch.load itself would load it silently).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as err:
        raise CheckpointError(path, f"cannot be read ({err.strerror})") from None
    if size == 0:
        raise CheckpointError(path, "is empty (0 bytes): its write never happened or was cut off")
    if not zipfile.is_zipfile(path):
        if head == b"PK\x03\x04":  # a zip that starts but has no directory at its end
            raise CheckpointError(
                path, f"is truncated ({fmt_bytes(size)}, the end of the archive is missing): a copy or write cut short"
            )
        raise CheckpointError(path, f"is not a PyTorch checkpoint ({fmt_bytes(size)}, not a zip archive)")
    try:
        with zipfile.ZipFile(path) as archive:
            bad_member = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        raise CheckpointError(path, f"is damaged ({err})") from None
    if bad_member is not None:
        raise CheckpointError(
            path, f"is damaged ({bad_member} fails its checksum): the file changed after it was written"
        )
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            path, "is not an attnlab checkpoint (it holds Python objects attnlab never stores)"
        ) from None
    except Exception as err:  # noqa: BLE001 - torch raises RuntimeError, KeyError, ... for broken archives
        reason = " ".join(str(err).split())[:160] or type(err).__name__
        raise CheckpointError(path, f"cannot be loaded ({reason})") from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(checkpoint, dict) or k not in checkpoint]
    if missing:
        raise CheckpointError(path, f"is not an attnlab checkpoint (no {', '.join(missing)})")
    return checkpoint


def load_model(path):
    """(GPTModule, checkpoint) from a checked checkpoint file, read once (for sample and analyze), or
    from a Hugging Face model dir of the GPT-2, Llama or DeepSeek-V3 family (interop.hf_load; step 0)."""

    if is_hf_dir(path):
        model, state = model_from_hf(path)
        checkpoint = {"hyper_parameters": {"model": model, "optim": {}, "max_steps": 1}, "global_step": 0}
        module = GPTModule(**checkpoint["hyper_parameters"])
        module.model.load_state_dict(state)
        return module, checkpoint
    checkpoint = read_checkpoint(path)
    try:
        module = GPTModule(**checkpoint["hyper_parameters"])
        module.load_state_dict(checkpoint["state_dict"])
    except (TypeError, KeyError, RuntimeError) as err:  # an attnlab checkpoint of another version
        reason = " ".join(str(err).split())[:160]
        raise CheckpointError(path, f"does not match this attnlab's model ({reason})") from None
    return module, checkpoint


def newest_intact(ckpt_dir: Path) -> tuple[Path | None, int | None, list[tuple[Path, str]]]:
    """(checkpoint, its step, [(skipped file, its problem)]): last.ckpt if intact, else the newest intact other.

    Only reads files; nothing is deleted or renamed, so a damaged file stays for the user to inspect.
    """
    files = sorted(
        Path(ckpt_dir).glob("*.ckpt"), key=lambda p: (p.name == "last.ckpt", p.stat().st_mtime), reverse=True
    )
    skipped = []
    for path in files:
        try:
            return path, int(read_checkpoint(path)["global_step"]), skipped
        except CheckpointError as err:
            skipped.append((path, err.problem))
    return None, None, skipped
