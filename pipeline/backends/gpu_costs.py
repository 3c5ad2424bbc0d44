"""The GPU cost table: what one codec-LM step and one Mimi turn cost on a GPU, as data.

A table is what `benchmarks/gpu_check.py` measured on one GPU (its JSON's `cost_table`),
or a YAML file in configs/gpu-costs/ fitted to such a run. It holds measured cells only
(or, for a field listed in `estimated`, cells derived from measured ones by a rule its
`source` states); every other shape is filled by the rules below, and `grid()` marks
which is which.

- talker decode: ms of a step making one frame for every row, per (row bucket, key
  bucket). Fill: piecewise linear in rows through the measured rows (of the nearest
  measured key bucket), extended linearly past the last two; below the first, its value.
  Keys add nothing beyond that (on the H200 attention was 1.1 of a 26.6 ms step).
- talker prefill: the ms a step pays on top of its decode when it carries prefill, per
  prompt tokens carried in it (all its prefill rows together). Fill: piecewise linear
  through the measured counts, then `prefill_ms_per_token` per token past the last
  (compute: about 2 GFLOP a token for a 1B backbone); below the first, its value.
  With `prefill_makes_frames` (the code of 048f89d and before) a prefill pass ran the
  depth decoder itself and made the first frame of each prompt it ended, and the decode
  ran only over rows past their prompts; without (since 42ab416) a prefill is the backbone
  only, and the prompts it ends make their first frame in the decode after it.
- host: `host_ms_per_step + host_ms_per_segment x segments` of the host's own work per
  step call (buffers, launches, handing frames out), outside the GPU.
- Mimi: ms of one batched turn per (K chunks, frames per chunk) bucket. Fill: piecewise
  linear in the turn's total frames (K x frames) through the measured cells; below the
  first, its value; past the last, linear through the last two.

Buckets are the codec-LM backend's: rows `row_multiple` x 1, 2, 4 .. up to `max_rows`,
keys `key_bucket_tokens` x 1, 2, 4 .. up to `max_keys`, Mimi K 1, 2, 4 .. `mimi_max_batch`
and frames 4, 8 .. `mimi_max_frames`.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scheduling.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def buckets(step: int, top: int) -> tuple[int, ...]:
    """step, 2 step, 4 step ... below top, then top."""
    out, size = [], step
    while size < top:
        out.append(size)
        size *= 2
    return (*out, top)


def bucket_of(value: int, sizes: Sequence[int]) -> int:
    """The smallest bucket holding `value` (the largest if none does)."""
    i = bisect.bisect_left(sizes, value)
    return sizes[min(i, len(sizes) - 1)]


def _interpolate(points: Sequence[tuple[float, float]], x: float, tail: float | None) -> float:
    """Piecewise linear through sorted `points`; below the first: its value; past the last:
    `tail` per unit if given, else the line through the last two."""
    xs = [p[0] for p in points]
    if x <= xs[0]:
        return points[0][1]
    if x >= xs[-1]:
        if tail is not None:
            return points[-1][1] + tail * (x - xs[-1])
        if len(points) == 1:
            return points[0][1]
        (x0, y0), (x1, y1) = points[-2], points[-1]
        return y1 + (y1 - y0) / (x1 - x0) * (x - x1)
    i = bisect.bisect_right(xs, x)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class GpuCostTable:
    """Measured cells and the constants of the fill rules (module doc); ms throughout."""

    name: str
    source: str  # the run it was measured in (or fitted to), and how
    # {(rows, keys): ms}: steps making one frame per row, no prefill
    decode_ms: Mapping[tuple[int, int], float]
    # {tokens carried: extra ms}: what a step carrying prefill pays on top of its decode
    prefill_ms: Mapping[int, float]
    prefill_ms_per_token: float
    host_ms_per_step: float
    host_ms_per_segment: float
    # {(K, frames): ms}: one batched Mimi turn of K chunks of `frames` frames each
    mimi_turn_ms: Mapping[tuple[int, int], float]
    prefill_makes_frames: bool = False  # see the module doc
    # fields whose cells are derived, not measured (the source says how)
    estimated: tuple[str, ...] = ()
    row_multiple: int = 4
    max_rows: int = 320
    key_bucket_tokens: int = 128
    max_keys: int = 620
    mimi_max_batch: int = 64
    mimi_max_frames: int = 32

    def __post_init__(self) -> None:
        if not self.decode_ms:
            raise ConfigError(f"cost table {self.name}: decode_ms needs a measured cell")
        if not self.mimi_turn_ms:
            raise ConfigError(f"cost table {self.name}: mimi_turn_ms needs a measured cell")
        if not self.prefill_ms:
            raise ConfigError(f"cost table {self.name}: prefill_ms needs a measured cell")
        cells = [
            *(("decode_ms", k, v) for k, v in self.decode_ms.items()),
            *(("prefill_ms", k, v) for k, v in self.prefill_ms.items()),
            *(("mimi_turn_ms", k, v) for k, v in self.mimi_turn_ms.items()),
        ]
        for field, key, ms in cells:
            if not isinstance(ms, int | float) or isinstance(ms, bool) or ms < 0:
                raise ConfigError(
                    f"cost table {self.name}: {field}[{key}] must be a number >= 0, got {ms!r}"
                )
        for name in ("prefill_ms_per_token", "host_ms_per_step", "host_ms_per_segment"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"cost table {self.name}: {name} must be >= 0, got {value!r}")
        fields = ("decode_ms", "prefill_ms", "mimi_turn_ms")
        if not isinstance(self.estimated, tuple) or not set(self.estimated) <= set(fields):
            raise ConfigError(
                f"cost table {self.name}: estimated lists fields among {', '.join(fields)}"
            )
        if not isinstance(self.prefill_makes_frames, bool):
            raise ConfigError(f"cost table {self.name}: prefill_makes_frames must be a bool")
        for name in ("row_multiple", "max_rows", "key_bucket_tokens", "max_keys"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"cost table {self.name}: {name} must be an integer >= 1")
        for name in ("mimi_max_batch", "mimi_max_frames"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"cost table {self.name}: {name} must be an integer >= 1")

    # buckets
    @property
    def row_buckets(self) -> tuple[int, ...]:
        return buckets(self.row_multiple, self.max_rows)

    @property
    def key_buckets(self) -> tuple[int, ...]:
        return buckets(self.key_bucket_tokens, self.max_keys)

    @property
    def mimi_batches(self) -> tuple[int, ...]:
        return buckets(1, self.mimi_max_batch)

    @property
    def mimi_frames(self) -> tuple[int, ...]:
        return tuple(range(4, self.mimi_max_frames + 1, 4))

    # costs
    def decode(self, rows: int, keys: int) -> float:
        """ms of a decode step over the row bucket holding `rows`, keys up to `keys`."""
        measured_keys = sorted({k for _, k in self.decode_ms})
        nearest = min(measured_keys, key=lambda k: (abs(k - keys), k))
        points = sorted((r, ms) for (r, k), ms in self.decode_ms.items() if k == nearest)
        return _interpolate(points, bucket_of(rows, self.row_buckets), None)

    def prefill(self, tokens: int) -> float:
        """Extra ms of a step carrying `tokens` prompt tokens of prefill (0: none)."""
        if tokens <= 0:
            return 0.0
        points = sorted(self.prefill_ms.items())
        return _interpolate(points, tokens, self.prefill_ms_per_token)

    def host(self, segments: int) -> float:
        return self.host_ms_per_step + self.host_ms_per_segment * segments

    def mimi(self, chunks: int, frames: int) -> float:
        """ms of one Mimi turn of `chunks` chunks, the longest `frames` frames (padded to
        its bucket; past the largest batch, turns of the largest)."""
        if chunks <= 0:
            return 0.0
        top = self.mimi_max_batch
        full, rest = divmod(chunks, top)
        frames_bucket = bucket_of(max(frames, 1), self.mimi_frames)
        points = sorted({k * f: ms for (k, f), ms in self.mimi_turn_ms.items()}.items())
        total = full * _interpolate(points, top * frames_bucket, None)
        if rest:
            k = bucket_of(rest, self.mimi_batches)
            total += _interpolate(points, k * frames_bucket, None)
        return total

    def _measured(self, field: str, key: object) -> bool:
        return field not in self.estimated and key in getattr(self, field)

    def grid(self) -> dict[str, Any]:
        """Every bucket's cost, each marked measured or filled (by the module doc's rules)."""
        decode = {
            f"{r}x{k}": {
                "ms": round(self.decode(r, k), 3),
                "measured": self._measured("decode_ms", (r, k)),
            }
            for r in self.row_buckets
            for k in self.key_buckets
        }
        tokens = sorted({*self.prefill_ms, *(64 * n for n in (1, 2, 4, 8, 16, 32))})
        prefill = {
            str(t): {"ms": round(self.prefill(t), 3), "measured": self._measured("prefill_ms", t)}
            for t in tokens
        }
        mimi = {
            f"{k}x{f}": {
                "ms": round(self.mimi(k, f), 3),
                "measured": self._measured("mimi_turn_ms", (k, f)),
            }
            for k in self.mimi_batches
            for f in self.mimi_frames
        }
        return {"decode_ms": decode, "prefill_ms": prefill, "mimi_turn_ms": mimi}

    def to_dict(self) -> dict[str, Any]:
        """The table in the YAML/JSON schema `table_from_dict` reads."""
        return {
            "name": self.name,
            "source": self.source,
            "estimated": list(self.estimated),
            "talker": {
                "row_multiple": self.row_multiple,
                "max_rows": self.max_rows,
                "key_bucket_tokens": self.key_bucket_tokens,
                "max_keys": self.max_keys,
                "decode_ms": [
                    {"rows": r, "keys": k, "ms": ms}
                    for (r, k), ms in sorted(self.decode_ms.items())
                ],
                "prefill_ms": [
                    {"tokens": t, "ms": ms} for t, ms in sorted(self.prefill_ms.items())
                ],
                "prefill_ms_per_token": self.prefill_ms_per_token,
                "prefill_makes_frames": self.prefill_makes_frames,
                "host_ms_per_step": self.host_ms_per_step,
                "host_ms_per_segment": self.host_ms_per_segment,
            },
            "mimi": {
                "max_batch": self.mimi_max_batch,
                "max_frames": self.mimi_max_frames,
                "turn_ms": [
                    {"chunks": k, "frames": f, "ms": ms}
                    for (k, f), ms in sorted(self.mimi_turn_ms.items())
                ],
            },
        }


def _cells(where: str, rows: object, keys: tuple[str, ...]) -> dict:
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{where} must be a non-empty list of {{{', '.join(keys)}, ms}}")
    out: dict = {}
    for row in rows:
        if not isinstance(row, dict) or set(row) != {*keys, "ms"}:
            raise ConfigError(f"{where}: each cell is {{{', '.join(keys)}, ms}}, got {row!r}")
        index = tuple(row[k] for k in keys)
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in index):
            raise ConfigError(f"{where}: {', '.join(keys)} must be integers >= 1, got {row!r}")
        if index in out:
            raise ConfigError(f"{where}: cell {row!r} given twice")
        out[index] = row["ms"]
    return out


def _section(data: Mapping[str, Any], name: str, known: set[str]) -> Mapping[str, Any]:
    body = data.get(name)
    if not isinstance(body, dict):
        raise ConfigError(f"cost table: section {name!r} missing")
    unknown = set(body) - known
    if unknown:
        raise ConfigError(f"cost table {name}: unknown field(s) {', '.join(sorted(unknown))}")
    return body


def table_from_dict(data: Mapping[str, Any]) -> GpuCostTable:
    """A table from its YAML / JSON form (`GpuCostTable.to_dict`); ConfigError naming the
    field otherwise."""
    if not isinstance(data, dict):
        raise ConfigError("cost table: a mapping with name, source, talker and mimi")
    unknown = set(data) - {"name", "source", "estimated", "talker", "mimi"}
    if unknown:
        raise ConfigError(f"cost table: unknown field(s) {', '.join(sorted(unknown))}")
    talker_keys = {
        "row_multiple",
        "max_rows",
        "key_bucket_tokens",
        "max_keys",
        "decode_ms",
        "prefill_ms",
        "prefill_ms_per_token",
        "prefill_makes_frames",
        "host_ms_per_step",
        "host_ms_per_segment",
    }
    talker = _section(data, "talker", talker_keys)
    mimi = _section(data, "mimi", {"max_batch", "max_frames", "turn_ms"})
    name = str(data.get("name") or "unnamed")
    for field in ("prefill_ms_per_token", "host_ms_per_step", "host_ms_per_segment"):
        if field not in talker:
            raise ConfigError(f"cost table {name}: talker.{field} missing")
    names = ("row_multiple", "max_rows", "key_bucket_tokens", "max_keys")
    sizes = {k: talker[k] for k in names if talker.get(k) is not None}
    return GpuCostTable(
        name=name,
        source=str(data.get("source") or ""),
        estimated=tuple(data.get("estimated") or ()),
        decode_ms={
            (r, k): ms
            for (r, k), ms in _cells(
                f"cost table {name}: talker.decode_ms", talker.get("decode_ms"), ("rows", "keys")
            ).items()
        },
        prefill_ms={
            t: ms
            for (t,), ms in _cells(
                f"cost table {name}: talker.prefill_ms", talker.get("prefill_ms"), ("tokens",)
            ).items()
        },
        prefill_ms_per_token=talker["prefill_ms_per_token"],
        prefill_makes_frames=talker.get("prefill_makes_frames", False),
        host_ms_per_step=talker["host_ms_per_step"],
        host_ms_per_segment=talker["host_ms_per_segment"],
        mimi_turn_ms=_cells(
            f"cost table {name}: mimi.turn_ms", mimi.get("turn_ms"), ("chunks", "frames")
        ),
        mimi_max_batch=mimi.get("max_batch", 64),
        mimi_max_frames=mimi.get("max_frames", 32),
        **sizes,
    )


def load_cost_table(path: str | Path) -> GpuCostTable:
    """The table in a YAML (or JSON) file; a relative path is read from the repository
    root. A gpu_check JSON is read through its `cost_table` entry."""
    where = Path(path)
    if not where.is_absolute():
        where = ROOT / where
    try:
        data = yaml.safe_load(where.read_text())
    except OSError as error:
        raise ConfigError(f"cost table {path}: {error}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"cost table {path}: not YAML ({error})") from None
    if isinstance(data, dict) and "cost_table" in data:
        data = data["cost_table"]
    return table_from_dict(data)


def sustained_streams(
    table: GpuCostTable, *, prefill_rows: int, prefill_chunk_tokens: int, frame_ms: float
) -> float | None:
    """Streams at 1x a batched loop with these costs sustains: the most rows whose step,
    carrying a full prefill (`prefill_rows` x `prefill_chunk_tokens` tokens) at the longest
    keys, takes at most a frame's playing time, and at most the streams Mimi keeps up with
    (its largest measured turn's chunks of 8 new frames each, one frame per `frame_ms`).
    None when not even one row fits. Admission's capacity on a GPU backend (the gpu_model
    replaying a table, the codec LM given the table its GPU measured) is this figure."""
    prefill_ms = table.prefill(prefill_rows * prefill_chunk_tokens)
    rows = [
        n
        for n in range(1, table.max_rows + 1)
        if table.decode(n, table.max_keys) + prefill_ms + table.host(n) <= frame_ms
    ]
    if not rows:
        return None
    chunks = table.mimi_max_batch
    turn_ms = table.mimi(chunks, 16)  # 8 new frames + 8 of context, as measured
    mimi_streams = chunks * 8 * frame_ms / turn_ms if turn_ms > 0 else float("inf")
    return float(min(max(rows), mimi_streams))
