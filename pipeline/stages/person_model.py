"""The person stage's model files: ultralytics imported offline, and the `.pt` weights exported once
to ONNX into the user cache, keyed by their content (see pipeline/stages/person.py for the runtime)."""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("pipeline.stages.person")


def import_ultralytics_offline():
    """Import ultralytics so that it never reaches the network (hub, events, fonts, auto-install).

    The switches are read at import time, so they are set before the first import.
    """
    os.environ.setdefault("YOLO_OFFLINE", "1")        # is_online() -> False: no events, no hub
    os.environ.setdefault("YOLO_AUTOINSTALL", "0")    # never pip-install a missing requirement
    os.environ.setdefault("YOLO_VERBOSE", "0")
    os.environ.setdefault("ULTRALYTICS_SAFE_LOAD", "1")  # weights_only loading of known model classes
    from PIL import Image
    from ultralytics import YOLO  # heavy: torch, cv2
    from ultralytics.utils import patches

    # ultralytics replaces PIL.Image.open process-wide with a wrapper that tries to pip-install
    # pi-heif when Pillow cannot identify a file; that would change every decode error of the
    # process into "No module named 'pi_heif'". We pass it decoded arrays, so give Pillow back.
    Image.open = getattr(patches, "_image_open", Image.open)
    return YOLO


BACKENDS = ("auto", "onnx", "torch")


NMS_IOU = 0.7          # ultralytics predict's default


MAX_DET = 300


def cache_dir() -> Path:
    """The user cache of humanset: $HUMANSET_CACHE, else $XDG_CACHE_HOME/humanset, else ~/.cache/humanset."""
    if os.environ.get("HUMANSET_CACHE"):
        return Path(os.environ["HUMANSET_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "humanset"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def onnx_path(weights: Path, folder: Path | None = None) -> Path:
    """Where the ONNX export of `weights` lives: keyed by the weights' content, not their name."""
    return (folder or cache_dir() / "onnx") / f"{weights.stem}-{file_sha256(weights)[:16]}.onnx"


def export_onnx(weights: Path, folder: Path | None = None) -> Path:
    """The ONNX export of an ultralytics .pt, made once and cached (see module docstring).

    Exported in a private temporary folder (ultralytics writes next to its input, which may be a
    read-only site-packages), then moved in place atomically under a file lock, so concurrent
    actors on one machine export once and never read a half-written file.
    """
    out = onnx_path(weights, folder)
    if out.is_file():
        return out
    import fcntl

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock = open(out.parent / ".export.lock", "w")
    except OSError as e:
        raise RuntimeError(f"the ONNX cache {out.parent} is not writable ({e})") from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if out.is_file():  # another process finished it while we waited
                return out
            YOLO = import_ultralytics_offline()
            with tempfile.TemporaryDirectory(dir=out.parent, prefix=".export-") as tmp:
                src = Path(tmp) / weights.name
                shutil.copyfile(weights, src)
                with contextlib.redirect_stdout(open(os.devnull, "w")):
                    made = YOLO(str(src)).export(format="onnx", dynamic=True, simplify=False, half=False,
                                                 nms=False, imgsz=640, batch=1, device="cpu", verbose=False)
                os.replace(made, out)
        except Exception as e:
            raise RuntimeError(f"person.weights={weights}: ONNX export failed ({e}); install the 'onnx' "
                               f"package, or set person.backend=torch") from e
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    log.info("person: exported %s to %s", weights.name, out)
    return out

