"""What a vLLM server says it runs, against what its command asked for.

vLLM reports its resolved configuration in three places, all read here:

- the startup log's ``non-default args: {...}`` line (the API server's parsed arguments:
  what the parser took, before the engine resolves anything);
- the engine core's ``Initializing a V1 LLM engine (vX) with config: model=..., ...`` line
  (the resolved ``VllmConfig``: lengths, parallel sizes, quantization, the speculative
  method and draft count, the whole compilation config with its CUDA graph mode and capture
  sizes), plus ``Performance mode set to '...'``;
- ``/metrics``' ``vllm:*_config_info`` gauges (the cache config: KV bytes, memory
  utilization, block size, prefix caching).

``check(argv, resolved)`` compares each flag of a ``vllm serve`` argv with the most resolved
report of it and returns one ``SettingCheck`` per flag: ``in effect``, ``differs`` (the
server runs something else, or its parser logged another value) or ``not reported`` (no
report carries the resolved value; the parsed value, when the parser logged it, is kept
beside). Everything here is pure: text in,
records out.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

IN_EFFECT = "in effect"
DIFFERS = "differs"
NOT_REPORTED = "not reported"

_ENGINE_MARK = "with config: "
_ARGS_MARK = "non-default args: "
_PERF_MODE = re.compile(r"Performance mode set to '([^']*)'")
_ENGINE_VERSION = re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\)")
_KV_RESERVED = re.compile(
    r"reserved ([\d.]+) GiB memory for KV Cache as specified by "
    r"kv_cache_memory_bytes"
)
_RUNTIME_MODE = re.compile(r"setting cudagraph_mode=(\w+)|Overriding to (?:CUDAGraphMode\.)?(\w+)")
_CAPTURE = re.compile(r"Capturing CUDA graphs \(([^)]*)\):\s*\d+%\|[^|]*\|\s*\d+/(\d+)")
_ENUM = re.compile(r"<(\w+)\.(\w+): ([^<>]*)>")
_INFO_LINE = re.compile(r"^(vllm:\w+_config_info)\{(.*)\}\s+\S+\s*$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

#: Flags that say where to listen or what to load, not how to serve: not compared.
SKIPPED = frozenset(
    {
        "--host",
        "--port",
        "--model",
        "--served-model-name",
        "--headless",
        "--api-key",
        "--uvicorn-log-level",
        "--disable-log-requests",
        "--enable-log-requests",
        "--disable-uvicorn-access-log",
        "--enable-prompt-tokens-details",
        "--trust-remote-code",
        "--data-parallel-address",
        "--data-parallel-rpc-port",
        "--master-addr",
        "--master-port",
        "--node-rank",
        "--nnodes",
        "--data-parallel-start-rank",
    }
)

#: Short flags vLLM accepts, by their long name.
ALIASES = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-q": "--quantization",
    "-O": "--compilation-config",
    "-cc": "--compilation-config",
    "-sc": "--speculative-config",
}

#: Engine-line keys whose name differs from the flag's destination.
ENGINE_KEYS = {"max_model_len": "max_seq_len", "device": "device_config"}

#: Compilation-config keys whose requested value the engine reports.
COMPILATION_KEYS = (
    "mode",
    "cudagraph_mode",
    "cudagraph_capture_sizes",
    "max_cudagraph_capture_size",
    "backend",
)


#: The CUDA graph mode the kinds of graphs a start captured imply (vLLM's progress bars:
#: ``Capturing CUDA graphs (decode, FULL)``).
CAPTURED_MODES = {
    frozenset({"decode, FULL"}): "FULL_DECODE_ONLY",
    frozenset({"mixed prefill-decode, PIECEWISE", "decode, FULL"}): "FULL_AND_PIECEWISE",
    frozenset({"mixed prefill-decode, PIECEWISE"}): "PIECEWISE",
}


@dataclass(frozen=True, slots=True)
class Resolved:
    """The parsed reports (empty where the log or /metrics lacked one)."""

    version: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    performance_mode: str | None = None
    info: dict[str, dict[str, str]] = field(default_factory=dict)
    kv_reserved_gib: float | None = None
    runtime_cudagraph_mode: str | None = None
    captured: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A compact record for run.json: the engine line with its compilation config cut
        to the keys compared, and the *_config_info labels."""
        engine = dict(self.engine)
        cc = engine.get("compilation_config")
        if isinstance(cc, dict):
            engine["compilation_config"] = {k: cc[k] for k in COMPILATION_KEYS if k in cc}
        return {
            "vllm_version": self.version,
            "engine": _jsonable(engine),
            "performance_mode": self.performance_mode,
            "config_info": self.info,
            "kv_reserved_gib": self.kv_reserved_gib,
            "runtime_cudagraph_mode": self.runtime_cudagraph_mode,
            "captured_cuda_graphs": self.captured,
        }


@dataclass(frozen=True, slots=True)
class SettingCheck:
    """One requested setting: the flag (``--flag`` or ``--flag.key`` for a key of a JSON
    config), the value asked for, the value the server reports (``None``: not reported),
    where that came from, the parsed value (``non-default args``) and the status."""

    flag: str
    requested: str
    in_effect: str | None
    source: str | None
    status: str
    parsed: str | None = None

    def line(self) -> str:
        if self.status == DIFFERS:
            return f"{self.flag} {self.requested}: server runs {self.in_effect} ({self.source})"
        if self.status == NOT_REPORTED:
            seen = f"; parsed as {self.parsed}" if self.parsed is not None else ""
            return f"{self.flag} {self.requested}: not reported{seen}"
        return f"{self.flag} {self.requested}: in effect ({self.source})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------- parsing


class EnumValue(str):
    """An enum member from a repr, ``<CompilationMode.NONE: 0>``: the text is its name
    (``NONE``), ``value`` the repr of its value (``0``); a setting matches either."""

    value: str

    def __new__(cls, name: str, value: str) -> EnumValue:
        obj = super().__new__(cls, name)
        obj.value = value
        return obj


_ENUM_TAG = "\x00enum\x00"


def _enums(v: Any) -> Any:
    if isinstance(v, str) and v.startswith(_ENUM_TAG):
        name, _, value = v[len(_ENUM_TAG) :].partition("\x00")
        return EnumValue(name, value)
    if isinstance(v, dict):
        return {k: _enums(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_enums(x) for x in v]
    return v


def _py_literal(text: str) -> Any:
    """A Python repr (dict, list, number, string) with enum members ``<E.NAME: v>`` read
    as ``EnumValue``; ``None`` when it is not a literal."""
    tagged = _ENUM.sub(lambda m: repr(f"{_ENUM_TAG}{m.group(2)}\x00{m.group(3)}"), text.strip())
    try:
        return _enums(ast.literal_eval(tagged))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _quote_end(text: str, i: int) -> int:
    """Where the string opened by the quote at ``text[i]`` closes (past the end when it
    does not); a backslash escapes the character after it."""
    quote = text[i]
    i += 1
    while i < len(text) and text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return i


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and quotes."""
    parts: list[str] = []
    depth = start = i = 0
    while i < len(text):
        c = text[i]
        if c in "'\"":
            i = _quote_end(text, i)
        elif c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth = max(0, depth - 1)
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _call_kwargs(text: str) -> dict[str, Any] | None:
    """``Name(a=1, b='x')`` as ``{'a': 1, 'b': 'x'}``; None when ``text`` is no such call."""
    m = re.fullmatch(r"\w+\((.*)\)", text.strip(), re.S)
    if not m:
        return None
    out: dict[str, Any] = {}
    for part in _split_top(m.group(1)):
        key, eq, value = part.partition("=")
        if eq:
            lit = _py_literal(value)
            out[key.strip()] = value.strip() if lit is None and value.strip() != "None" else lit
    return out


def parse_engine_config(text: str) -> dict[str, Any]:
    """The ``key=value, ...`` list after ``with config:``: literals as Python values,
    ``SpeculativeConfig(...)`` and other calls as dicts, the rest as text."""
    out: dict[str, Any] = {}
    for part in _split_top(text):
        key, eq, value = part.partition("=")
        if not eq or not re.fullmatch(r"\w+", key.strip()):
            continue
        value = value.strip()
        call = _call_kwargs(value)
        if call is not None:
            out[key.strip()] = call
            continue
        lit = _py_literal(value)
        out[key.strip()] = lit if lit is not None or value == "None" else value
    return out


def parse_metrics_info(text: str) -> dict[str, dict[str, str]]:
    """Every ``vllm:*_config_info`` gauge of a Prometheus page: name -> labels (engine 0's
    when several engines report)."""
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        m = _INFO_LINE.match(line.strip())
        if not m:
            continue
        labels = {
            k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(m.group(2))
        }
        name = m.group(1).removeprefix("vllm:")
        if name not in out or labels.get("engine") == "0":
            out[name] = labels
    return out


class _LogReader:
    """The reports of a startup log, fed a line at a time; a new ``non-default args`` line
    (a new start) forgets what the previous start reported, but the version."""

    def __init__(self) -> None:
        self.version: str | None = None
        self._start({})

    def _start(self, args: dict[str, Any]) -> None:
        self.args = args
        self.engine: dict[str, Any] = {}
        self.perf: str | None = None
        self.kv: float | None = None
        self.runtime: str | None = None
        self.captured: dict[str, int] = {}

    def feed(self, line: str) -> None:
        """The first reader that takes the line; graph captures when none does."""
        for read in (self._args, self._engine, self._perf, self._kv, self._runtime):
            if read(line):
                return
        for kind, total in _CAPTURE.findall(line):
            self.captured.setdefault(kind, int(total))

    def _args(self, line: str) -> bool:
        if _ARGS_MARK not in line:
            return False
        parsed = _py_literal(line.split(_ARGS_MARK, 1)[1])
        if isinstance(parsed, dict):
            self._start(parsed)
        return True

    def _engine(self, line: str) -> bool:
        if "Initializing a V1 LLM engine" not in line or _ENGINE_MARK not in line:
            return False
        if not self.engine:  # data-parallel ranks repeat the line: the first one counts
            m = _ENGINE_VERSION.search(line)
            self.version = m.group(1) if m else self.version
            self.engine = parse_engine_config(line.split(_ENGINE_MARK, 1)[1])
        return True

    def _perf(self, line: str) -> bool:
        m = _PERF_MODE.search(line)
        if m is not None:
            self.perf = m.group(1)
        return m is not None

    def _kv(self, line: str) -> bool:
        m = _KV_RESERVED.search(line) if self.kv is None else None
        if m is not None:
            self.kv = float(m.group(1))
        return m is not None

    def _runtime(self, line: str) -> bool:
        m = _RUNTIME_MODE.search(line)
        if m is None or "WARNING" not in line:
            return False
        self.runtime = m.group(1) or m.group(2)
        return True


def parse_log(text: str, metrics: str = "") -> Resolved:
    """The reports in a server's startup log (and its /metrics page, when given). When the
    log holds several starts, the last one counts."""
    log = _LogReader()
    for line in text.splitlines():
        log.feed(line)
    return Resolved(
        version=log.version,
        args=log.args,
        engine=log.engine,
        performance_mode=log.perf,
        info=parse_metrics_info(metrics),
        kv_reserved_gib=log.kv,
        runtime_cudagraph_mode=log.runtime,
        captured=log.captured,
    )


# ---------------------------------------------------------------------------- comparing


def requested_flags(argv: Sequence[str]) -> list[tuple[str, str]]:
    """``(long flag, value)`` for each flag of ``argv`` (the arguments after ``vllm serve``
    or the API server module; positional model first or absent); a bare flag's value is
    ``"true"``, ``--no-X`` becomes ``(--X, "false")``, ``--flag=value`` is split."""
    out: list[tuple[str, str]] = []
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        if not item.startswith("-"):
            i += 1
            continue
        flag, eq, value = item.partition("=")
        if not eq:
            if i + 1 < len(items) and not items[i + 1].startswith("-"):
                value = items[i + 1]
                i += 1
            else:
                value = "true"
        i += 1
        flag = ALIASES.get(flag, flag)
        if flag.startswith("--no-"):
            flag, value = "--" + flag[5:], "false"
        out.append((flag, value))
    return out


def _value(text: str) -> Any:
    """A requested value as data: JSON, a number, a boolean word, else the text."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def same(requested: Any, reported: Any) -> bool:
    """Equal as settings: numbers by value, booleans by truth, text case-blind with a
    ``torch.`` dtype prefix dropped, lists element-wise."""
    if isinstance(reported, EnumValue):
        return _text(requested) == _text(reported) or same(requested, _py_literal(reported.value))
    if isinstance(requested, list) and isinstance(reported, (list, tuple)):
        return len(requested) == len(reported) and all(
            same(a, b) for a, b in zip(requested, reported, strict=True)
        )
    return _same_scalar(requested, reported)


def _same_scalar(requested: Any, reported: Any) -> bool:
    if isinstance(requested, bool) or isinstance(reported, bool):
        return _truth(requested) == _truth(reported)
    if isinstance(requested, (int, float)) and not isinstance(reported, (list, dict)):
        try:
            return math.isclose(float(requested), float(str(reported)), rel_tol=1e-9)
        except ValueError:
            return False
    if requested is None or reported is None:
        return requested is None and reported in (None, "None")
    return _text(requested) == _text(reported)


def _truth(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    low = str(v).strip().lower()
    return True if low in ("true", "1") else False if low in ("false", "0") else None


def _text(v: Any) -> str:
    return str(v).strip().lower().removeprefix("torch.")


def _show(v: Any) -> str:
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def _lookup(dest: str, resolved: Resolved) -> tuple[Any, str] | None:
    """The most resolved report of the destination ``dest``: the *_config_info gauges,
    then the engine config line; None when neither has it."""
    for name, labels in resolved.info.items():
        if dest in labels:
            return labels[dest], f"/metrics {name}"
    key = ENGINE_KEYS.get(dest, dest)
    if key in resolved.engine:
        return resolved.engine[key], "engine config"
    return None


def _check_one(
    flag: str, value: Any, text: str, parsed: Any, found: tuple[Any, str] | None
) -> SettingCheck:
    parsed_s = None if parsed is _MISSING else _show(parsed)
    if found is None and parsed is not _MISSING and not same(value, parsed):
        # the server was started with something else than this command asks for
        return SettingCheck(flag, text, parsed_s, "non-default args", DIFFERS, parsed_s)
    if found is None:
        return SettingCheck(flag, text, None, None, NOT_REPORTED, parsed_s)
    got, source = found
    status = IN_EFFECT if same(value, got) else DIFFERS
    return SettingCheck(flag, text, _show(got), source, status, parsed_s)


_MISSING = object()


def _json_checks(flag: str, value: Any, text: str, resolved: Resolved) -> list[SettingCheck]:
    dest = flag[2:].replace("-", "_")
    parsed_all = resolved.args.get(dest)
    if not isinstance(value, dict):
        return [
            SettingCheck(
                flag,
                text,
                None,
                None,
                NOT_REPORTED,
                None if parsed_all is None else _show(parsed_all),
            )
        ]
    reported = resolved.engine.get(dest)
    out = []
    for key, want in value.items():
        parsed = parsed_all.get(key, _MISSING) if isinstance(parsed_all, dict) else _MISSING
        found: tuple[Any, str] | None = None
        if isinstance(reported, dict):
            rkey = (
                "num_spec_tokens"
                if (dest == "speculative_config" and key == "num_speculative_tokens")
                else key
            )
            if rkey in reported:
                found = (reported[rkey], "engine config")
        if dest == "compilation_config":
            found = _runtime_graphs(key, want, resolved, found)
        out.append(_check_one(f"{flag}.{key}", want, _show(want), parsed, found))
    return out


def _runtime_graphs(
    key: str, want: Any, resolved: Resolved, found: tuple[Any, str] | None
) -> tuple[Any, str] | None:
    """What the model runner did after the engine line was logged: a downgrade warning
    (``setting cudagraph_mode=X``) replaces the configured mode; the graphs it captured
    (``Capturing CUDA graphs (decode, FULL): .../N``) must number the sizes asked for."""
    if key == "cudagraph_mode":
        return _runtime_mode(resolved) or found
    if (
        key == "cudagraph_capture_sizes"
        and isinstance(want, list)
        and found is not None
        and same(want, found[0])
    ):
        return _captured_sizes(want, resolved) or found
    return found


def _runtime_mode(resolved: Resolved) -> tuple[Any, str] | None:
    """The CUDA graph mode the model runner settled on: its override, else the one the
    kinds of graphs it captured imply; None when the log says neither."""
    if resolved.runtime_cudagraph_mode is not None:
        return resolved.runtime_cudagraph_mode, "log (model runner override)"
    mode = CAPTURED_MODES.get(frozenset(resolved.captured)) if resolved.captured else None
    return None if mode is None else (mode, "log (graph capture)")


def _captured_sizes(want: list[Any], resolved: Resolved) -> tuple[Any, str] | None:
    """The capture sizes against the full graphs captured: a count other than the sizes
    asked for differs; None when no full graphs were captured."""
    full = {k: n for k, n in resolved.captured.items() if k.endswith("FULL")}
    for kind, n in full.items():
        if n != len(want):
            return f"{n} graphs captured ({kind})", "log (graph capture)"
    if full:
        kinds = ", ".join(f"{n} ({k})" for k, n in full.items())
        return want, f"engine config; captured {kinds}"
    return None


def check(argv: Sequence[str], resolved: Resolved) -> list[SettingCheck]:
    """One ``SettingCheck`` per requested flag of ``argv`` (``SKIPPED`` ones aside), each
    key of a JSON config flag on its own (``--compilation-config.cudagraph_mode``)."""
    out: list[SettingCheck] = []
    for flag, text in requested_flags(argv):
        if flag in SKIPPED:
            continue
        value = _value(text)
        if flag in ("--speculative-config", "--compilation-config"):
            out += _json_checks(flag, value, text, resolved)
        else:
            out.append(_flag_check(flag, value, text, resolved))
    return out


def _flag_check(flag: str, value: Any, text: str, resolved: Resolved) -> SettingCheck:
    """The check of a plain (not JSON) flag."""
    dest = flag[2:].replace("-", "_")
    parsed = resolved.args.get(dest, _MISSING)
    found = _lookup(dest, resolved)
    if dest == "performance_mode" and resolved.performance_mode is not None:
        found = (resolved.performance_mode, "log")
    elif (
        dest == "kv_cache_memory_bytes"
        and found is None
        and resolved.kv_reserved_gib is not None
        and isinstance(value, (int, float))
    ):
        # the worker logs the reservation in GiB to one decimal: equal to that precision
        ok = abs(value / 2**30 - resolved.kv_reserved_gib) <= 0.05 + 1e-9
        return SettingCheck(
            flag,
            text,
            f"{resolved.kv_reserved_gib:g} GiB",
            "log (GiB, 1 decimal)",
            IN_EFFECT if ok else DIFFERS,
            None if parsed is _MISSING else _show(parsed),
        )
    return _check_one(flag, value, text, parsed, found)


def mismatches(checks: Sequence[SettingCheck]) -> list[SettingCheck]:
    return [c for c in checks if c.status == DIFFERS]


def summary(checks: Sequence[SettingCheck]) -> str:
    """``N in effect, M not reported, K differ`` for a log line."""
    n = {s: sum(1 for c in checks if c.status == s) for s in (IN_EFFECT, NOT_REPORTED, DIFFERS)}
    return f"{n[IN_EFFECT]} in effect, {n[NOT_REPORTED]} not reported, {n[DIFFERS]} differ"


def failure_line(checks: Sequence[SettingCheck], log: object = None) -> str:
    """The one line that fails a launch: every setting the server does not run."""
    bad = mismatches(checks)
    where = f" (log {log})" if log else ""
    return (
        f"vLLM is not running {len(bad)} requested setting(s): "
        + "; ".join(c.line() for c in bad)
        + where
    )


def to_markdown(checks: Sequence[SettingCheck]) -> str:
    """The checks as a table: flag, requested, in effect (or the parsed value), source,
    status; then the summary."""
    lines = ["| setting | requested | server reports | from | status |", "|---|---|---|---|---|"]
    for c in checks:
        shown = (
            c.in_effect
            if c.in_effect is not None
            else (f"(parsed {c.parsed})" if c.parsed is not None else "-")
        )
        lines.append(
            "| "
            + " | ".join(
                x.replace("|", "\\|")
                for x in (c.flag, c.requested, shown, c.source or "-", c.status)
            )
            + " |"
        )
    return "\n".join(lines) + f"\n\n{summary(checks)}\n"


def check_launch(info: Mapping[str, Any], log_text: str, metrics: str = "") -> list[SettingCheck]:
    """``check`` for a recorded launch: ``info`` is the launch JSON (or run.json's
    ``launch``), whose ``command`` is the argv that started the server."""
    command = info.get("command")
    if not isinstance(command, list) or len(command) < 3:
        raise ValueError("no 'command' list (the argv that started the server)")
    return check([str(a) for a in command[3:]], parse_log(log_text, metrics))


def _jsonable(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)
