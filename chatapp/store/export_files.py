"""An attachment in an exported message: its path as text, its fence labelled with a language.

In the chat an attachment is fenced with its path as the info string (`chat/attach.py`: the model
reads the name). A Markdown renderer takes the info string for a language, so an export would
highlight `notes/todo.py` as the language "notes/todo.py". The export puts the path above the fence
as text and gives the fence the language of the file's extension, or none.
"""

from __future__ import annotations

import re
from pathlib import PurePath

from chatapp.chat.attach import PASTED

LANGUAGES = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".ts": "typescript",
    ".tsx": "tsx", ".jsx": "jsx", ".rs": "rust", ".go": "go", ".c": "c", ".h": "c", ".cc": "cpp",
    ".cpp": "cpp", ".hpp": "cpp", ".java": "java", ".kt": "kotlin", ".rb": "ruby", ".php": "php",
    ".sh": "bash", ".bash": "bash", ".zsh": "zsh", ".fish": "fish", ".ps1": "powershell", ".sql": "sql",
    ".html": "html", ".css": "css", ".scss": "scss", ".json": "json", ".toml": "toml", ".yaml": "yaml",
    ".yml": "yaml", ".xml": "xml", ".md": "markdown", ".tex": "latex", ".lua": "lua", ".swift": "swift",
    ".cs": "csharp", ".r": "r", ".jl": "julia", ".hs": "haskell", ".ml": "ocaml", ".ex": "elixir",
    ".diff": "diff", ".patch": "diff", ".ini": "ini", ".cfg": "ini", ".dockerfile": "dockerfile",
}
NAMED = {"Makefile": "make", "makefile": "make", "Dockerfile": "dockerfile", "CMakeLists.txt": "cmake"}

# One attachment at the start of a message: a fence of 3+ backticks, the name, the text, the same
# fence on a line of its own, then the end of the message or the blank line before the next part.
BLOCK = re.compile(r"(?P<fence>`{3,})(?P<name>[^`\n]+)\n(?P<body>.*?)\n(?P=fence)(?:\n\n|\Z)", re.S)


def language(name: str) -> str:
    p = PurePath(name)
    return NAMED.get(p.name) or LANGUAGES.get(p.suffix.lower(), "")


def looks_like_file(name: str) -> bool:
    """An attachment's name, not a language a user wrote (```python): a path, a file name, or a paste."""
    return name == PASTED or any(c in name for c in "./\\~ ") or name in NAMED


def code_span(text: str) -> str:
    """`text` as inline code, whatever backticks it holds."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def relabel(user: str) -> str:
    """The message with each leading attachment's fence relabelled; anything else unchanged."""
    out, rest = [], user
    while (m := BLOCK.match(rest)) and looks_like_file(m["name"]):
        name, fence = m["name"], m["fence"]
        label = name if name == PASTED else code_span(name)
        out.append(f"{label}\n\n{fence}{language(name)}\n{m['body']}\n{fence}")
        rest = rest[m.end():]
    return "\n\n".join([*out, rest]) if out else user
