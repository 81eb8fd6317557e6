"""Perseus's edits to Megatron-LM's source, placed by the structure of the code rather than its text.

Two files get edits: megatron-core's ``schedules.py`` (the five hook decorators and their
guarded import) and Megatron-LM's ``pretrain_gpt.py`` (its ``__main__`` block accepts
``--perseus*`` and enables Perseus). Each place is found in the module's syntax tree. A function
is found by name however it is decorated, whatever its arguments' layout and whatever its
signature (the hook-point check judges the signature, see ``perseus_megatron.compat``). The
entry point is recognised in both generations of ``__main__``.

Every edit only inserts whole lines, and each inserted line is marked: it sits in a
``# >>> perseus-patch`` … ``# <<< perseus-patch`` block or ends in ``# perseus-patch``. So
:func:`revert` removes exactly what was inserted, and a patched file can be recognised. These are
pure functions of text: they import neither torch nor Megatron and write nothing.
``perseus_megatron.patch`` is the command that reads and writes the files.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Callable, Iterator, TypeGuard

from perseus.errors import PerseusError
from perseus_megatron.compat import HOOK_POINTS, missing_hook_points_in_source

SCHEDULES = "megatron/core/pipeline_parallel/schedules.py"
PRETRAIN_GPT = "pretrain_gpt.py"
BEGIN = "# >>> perseus-patch"
END = "# <<< perseus-patch"
TAG = "  # perseus-patch"


class PatchSiteError(PerseusError):
    """A place the patch needs is missing or ambiguous; the message names the file and the place."""


@dataclass(frozen=True)
class Insertion:
    """Whole lines inserted before line ``before`` (1-based; one past the last line: at the end)."""

    before: int
    lines: tuple[str, ...]  # without line endings
    what: str  # for --check: "decorator on forward_step (line 397)"


# ---------------------------------------------------------------------------------------- lines


def split_lines(text: str) -> list[str]:
    """The lines of ``text`` with their endings, numbered as ``ast`` numbers them (``\\n`` only)."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def _newline(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def apply_insertions(text: str, insertions: list[Insertion]) -> str:
    """``text`` with the insertions made; insertions before the same line keep their given order."""
    lines = split_lines(text)
    newline = _newline(text)
    if lines and not lines[-1].endswith("\n") and any(i.before > len(lines) for i in insertions):
        lines[-1] += newline
    for ins in sorted(insertions, key=lambda i: i.before, reverse=True):  # stable: same-line order kept
        lines[ins.before - 1:ins.before - 1] = [line + newline for line in ins.lines]
    return "".join(lines)


def _marked(lines: list[str], path: str) -> Iterator[tuple[int, str, bool]]:
    """(1-based number, line, inserted by the patch?) for every line; raises on a broken block."""
    start = 0
    for number, line in enumerate(lines, 1):
        body = line.strip()
        if body.startswith(BEGIN):
            if start:
                raise PatchSiteError(f"{path}: the perseus-patch block opened at line {start} is opened again at "
                                     f"line {number}; restore the file from version control")
            start = number
            yield number, line, True
        elif body.startswith(END):
            if not start:
                raise PatchSiteError(f"{path}: line {number} closes a perseus-patch block that was never opened; "
                                     "restore the file from version control")
            start = 0
            yield number, line, True
        else:
            yield number, line, bool(start) or line.rstrip().endswith(TAG)
    if start:
        raise PatchSiteError(f"{path}: the perseus-patch block opened at line {start} is never closed; "
                             "restore the file from version control")


def is_patched(text: str, path: str = "file") -> bool:
    """True when ``text`` carries lines this module inserts."""
    return any(inserted for _, _, inserted in _marked(split_lines(text), path))


def revert(text: str, path: str = "file") -> str:
    """``text`` without the lines this module inserted (the file as it was before patching)."""
    return "".join(line for _, line, inserted in _marked(split_lines(text), path) if not inserted)


# ----------------------------------------------------------------------------------- the tree


def _parse(text: str, path: str) -> ast.Module:
    try:
        return ast.parse(text, path)
    except SyntaxError as exc:
        raise PatchSiteError(f"{path}: not valid Python for this interpreter (line {exc.lineno}: {exc.msg})") from None


def _refuse_foreign_edits(text: str, path: str) -> None:
    if "perseus_megatron" in text or "_perseus_hook" in text:
        raise PatchSiteError(f"{path}: already has Perseus edits without the patcher's markers (a patches/*.patch "
                             "applied with git apply?); undo them (git apply -R, or git checkout the file) and run "
                             "the patcher again")


def _first_line(node: ast.stmt) -> int:
    """The line a statement starts on, its decorators included."""
    decorators = getattr(node, "decorator_list", None) or []
    return min([node.lineno, *(d.lineno for d in decorators)])


def _whole_lines(node: ast.stmt, lines: list[str], path: str, name: str) -> str:
    """The indentation of a statement that has its lines to itself; raises if it shares one."""
    first = lines[node.lineno - 1].encode()
    indent = first[:node.col_offset].decode()
    last = lines[(node.end_lineno or node.lineno) - 1].encode()
    after = last[node.end_col_offset or 0:].decode().strip()
    if indent.strip() or (after and not after.startswith("#")):
        raise PatchSiteError(f"{path}: {name} (line {node.lineno}) shares its line with another statement; "
                             "put it on lines of its own")
    return indent


# ------------------------------------------------------------------------------- schedules.py

SCHEDULES_IMPORT = (
    f"{BEGIN}: report training forward/backward steps to Perseus (python -m perseus_megatron.patch)",
    "try:",
    "    from perseus_megatron.hooks import hook as _perseus_hook",
    "except ImportError:  # Perseus not installed: the schedules run unchanged.",
    "",
    "    def _perseus_hook(point):",
    "        return lambda fn: fn",
    END,
)


def _is_import(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(node, (ast.Try, ast.If)):  # guarded imports: try: import x / except ImportError: ...
        return all(_is_import(n) for n in node.body)
    return False


def schedules_insertions(text: str, path: str = SCHEDULES) -> list[Insertion]:
    """Where megatron-core's ``schedules.py`` gets the guarded import and the five decorators.

    Each hook point is a top-level function found by name. Its ``@_perseus_hook`` goes above its
    other decorators (``@_otel_trace_fn(...)`` on upstream main), so that the module attribute is
    the Perseus wrapper that ``install_hooks`` recognises. The import goes after the last
    top-level import before the first hooked function.
    """
    _refuse_foreign_edits(text, path)
    tree = _parse(text, path)
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    absent = [name for name in HOOK_POINTS if name not in functions]
    if absent:
        raise PatchSiteError(f"{path}: no top-level function {absent[0]} (renamed or moved?); the Perseus hooks "
                             "need it, so this megatron-core cannot be patched: use a supported release "
                             "(docs/megatron.md)")
    problems = missing_hook_points_in_source(text)
    if problems:
        raise PatchSiteError(f"{path}: {problems[0]} not found (changed signature); the Perseus hooks read it, so "
                             "this megatron-core cannot be patched (docs/megatron.md, Supported versions)")
    first_hooked = min(_first_line(functions[name]) for name in HOOK_POINTS)
    imports = [node for node in tree.body if _is_import(node) and (node.end_lineno or node.lineno) < first_hooked]
    after = (imports[-1].end_lineno or imports[-1].lineno) if imports else first_hooked - 1
    insertions = [Insertion(after + 1, SCHEDULES_IMPORT, f"guarded import of perseus_megatron.hooks after line {after}")]
    for name in HOOK_POINTS:
        node = functions[name]
        insertions.append(Insertion(_first_line(node), (f'@_perseus_hook("{name}"){TAG}',),
                                    f"decorator on {name} (line {node.lineno})"))
    return insertions


# ------------------------------------------------------------------------------ pretrain_gpt.py


def _is_main_guard(node: ast.stmt) -> TypeGuard[ast.If]:
    if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1):
        return False
    if not isinstance(node.test.ops[0], ast.Eq):
        return False
    sides = [node.test.left, *node.test.comparators]
    names = {s.id for s in sides if isinstance(s, ast.Name)}
    constants = {s.value for s in sides if isinstance(s, ast.Constant)}
    return names == {"__name__"} and constants == {"__main__"}


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements of a block and of the blocks nested in it (if/try/with), in source order."""
    for node in body:
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue  # a definition's body does not run here
        for field in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(node, field, None) or [])
        for handler in getattr(node, "handlers", None) or []:
            yield from _statements(handler.body)


def _call_of(node: ast.stmt) -> ast.Call | None:
    """The call a statement makes, on its own or as the value of an assignment."""
    value = node.value if isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign)) else None
    return value if isinstance(value, ast.Call) else None


def _calls(node: ast.stmt, name: str) -> bool:
    """``name(...)`` as a statement or as the value of an assignment."""
    call = _call_of(node)
    return call is not None and isinstance(call.func, ast.Name) and call.func.id == name


def _one_call(statements: list[ast.stmt], name: str, path: str, required: bool) -> ast.stmt | None:
    found = [node for node in statements if _calls(node, name)]
    if len(found) > 1:
        lines = ", ".join(str(node.lineno) for node in found)
        raise PatchSiteError(f"{path}: its __main__ block calls {name}(...) more than once (lines {lines}); "
                             "the patcher needs exactly one")
    if not found and required:
        raise PatchSiteError(f"{path}: no {name}(...) call in its `if __name__ == \"__main__\":` block")
    return found[0] if found else None


def _block(indent: str, *lines: str) -> tuple[str, ...]:
    return tuple(indent + line if line else "" for line in lines)


def pretrain_gpt_insertions(text: str, path: str = PRETRAIN_GPT) -> list[Insertion]:
    """Where ``pretrain_gpt.py``'s ``__main__`` gets the Perseus flags, ``enable`` and ``close``.

    Generation core ≥ 0.18 (``args = parse_and_validate_args(...)`` before ``pretrain(...)``):
    ``parse_and_validate_args`` is wrapped so that its ``extra_args_provider`` also adds the flags,
    and ``perseus = enable_from_args(args)`` runs right before ``pretrain``. Generation core ≤ 0.17
    (``pretrain(..., extra_args_provider=..., args_defaults=...)`` parses): ``pretrain`` is wrapped
    the same way, and ``perseus = enable_from_argv()`` runs before it. Either way
    ``perseus.close()`` runs after ``pretrain`` returns, and Perseus is enabled only with
    ``--perseus``. The calls are found however their arguments are laid out.
    """
    _refuse_foreign_edits(text, path)
    tree = _parse(text, path)
    lines = split_lines(text)
    mains = [node for node in tree.body if _is_main_guard(node)]
    if len(mains) != 1:
        raise PatchSiteError(f"{path}: expected one top-level `if __name__ == \"__main__\":` block, found {len(mains)}")
    statements = list(_statements(mains[0].body))
    pretrain = _one_call(statements, "pretrain", path, required=True)
    assert pretrain is not None
    indent = _whole_lines(pretrain, lines, path, "pretrain(...)")
    before_pretrain = [node for node in statements if node.lineno < pretrain.lineno]
    parse = _one_call(before_pretrain, "parse_and_validate_args", path, required=False)
    after = (pretrain.end_lineno or pretrain.lineno) + 1
    close = Insertion(after, _block(indent, BEGIN, "if perseus is not None:", "    perseus.close()", END),
                      f"perseus.close() after pretrain(...) (line {pretrain.lineno})")
    if parse is not None:
        if not (isinstance(parse, ast.Assign) and len(parse.targets) == 1 and isinstance(parse.targets[0], ast.Name)):
            raise PatchSiteError(f"{path}: parse_and_validate_args(...) (line {parse.lineno}) is not assigned to one "
                                 "name, so the patcher cannot hand its result to Perseus")
        args_name = parse.targets[0].id
        parse_indent = _whole_lines(parse, lines, path, "parse_and_validate_args(...)")
        flags = Insertion(parse.lineno, _block(
            parse_indent,
            f"{BEGIN}: Megatron's parser also accepts the --perseus* flags (python -m perseus_megatron.patch)",
            "from perseus_megatron import enable_from_args, with_perseus_args",
            "",
            "parse_and_validate_args = with_perseus_args(parse_and_validate_args)",
            END,
        ), f"--perseus* flags for parse_and_validate_args(...) (line {parse.lineno})")
        enable = Insertion(pretrain.lineno, (f"{indent}perseus = enable_from_args({args_name})"
                                             f"{TAG}",), f"enable_from_args({args_name}) before pretrain(...) "
                                             f"(line {pretrain.lineno})")
        return [flags, enable, close]
    call = _call_of(pretrain)
    assert call is not None  # _one_call found the statement by this call
    keywords = {k.arg for k in call.keywords}
    if not keywords & {"extra_args_provider", "args_defaults"}:
        raise PatchSiteError(f"{path}: its __main__ block calls neither parse_and_validate_args(...) before pretrain(...) "
                             "nor pretrain(..., extra_args_provider=...), so the patcher cannot tell where Megatron "
                             "parses the arguments; use the launcher (python -m perseus_megatron.pretrain_gpt)")
    enable = Insertion(pretrain.lineno, _block(
        indent,
        f"{BEGIN}: Megatron's parser also accepts the --perseus* flags; --perseus enables Perseus",
        "from perseus_megatron import enable_from_argv, with_perseus_args",
        "",
        "pretrain = with_perseus_args(pretrain)",
        "perseus = enable_from_argv()  # None unless --perseus is given",
        END,
    ), f"--perseus* flags for pretrain(...) and enable_from_argv() before it (line {pretrain.lineno})")
    return [enable, close]


# -------------------------------------------------------------------------------------- files

PLANNERS: dict[str, Callable[[str, str], list[Insertion]]] = {
    SCHEDULES: schedules_insertions,
    PRETRAIN_GPT: pretrain_gpt_insertions,
}


def edit(path: str, text: str) -> tuple[list[Insertion], str]:
    """The insertions for the file at ``path`` (relative to the checkout) and the patched text.

    The result is checked before anyone writes it: it must still parse, and :func:`revert` must
    give ``text`` back exactly.
    """
    insertions = PLANNERS[path](text, path)
    after = apply_insertions(text, insertions)
    try:
        compile(after, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise PatchSiteError(f"{path}: the patched file would not parse (line {exc.lineno}: {exc.msg}); the places "
                             "found are unusual here: use the launcher (python -m perseus_megatron.pretrain_gpt)") from None
    if revert(after, path) != text:
        raise PatchSiteError(f"{path}: already has lines ending in '{TAG.strip()}' or a '{BEGIN}' line of its own, so "
                             "the patch could not be reverted exactly; remove them first")
    return insertions, after


def patched_text(path: str, text: str) -> str:
    """``text`` of the file at ``path`` (relative to the checkout) with the Perseus edits made."""
    return edit(path, text)[1]
