"""Errors a user can cause and fix. Faces print them as one line, never a traceback."""


class UserError(Exception):
    """Bad input from the user: shown as a one-line message."""


class ModelLoadError(UserError):
    """A model spec, file or directory that cannot be loaded."""


def where(e: BaseException) -> str:
    """`module:function` of the innermost frame of this project that `e` passed through (the
    innermost frame at all when none is ours): where an unexpected failure came from."""
    import traceback
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(root) and ".venv" not in f.filename]
    frame = (ours or frames or [None])[-1]
    if frame is None:
        return "unknown"
    path = Path(frame.filename).resolve()
    module = ".".join(path.relative_to(root).with_suffix("").parts) if path.is_relative_to(root) else path.stem
    return f"{module}:{frame.name}"


def unexpected(e: BaseException) -> str:
    """One line for an exception nobody expected: its type, where it came from, its first line."""
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    return f"internal error in {where(e)}: {type(e).__name__}{': ' + first if first else ''}"
