"""Criteo Kaggle click logs (``train.txt``): a reader and a generator of synthetic files in the same format.

:func:`read` maps each of the 26 hexadecimal categories to ``int(hex, 16) % table_size`` and each of the 13
integers ``x`` to ``log(1 + max(x, 0))`` (empty: 0), as the DLRM reference does; a malformed line raises
:class:`CriteoFormatError`. :func:`write_synthetic` plants a learnable signal.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import torch

from harness.data.cache import atomic_write

NUM_DENSE, NUM_SPARSE = 13, 26
COLUMNS = ["label", *(f"I{i}" for i in range(1, NUM_DENSE + 1)), *(f"C{i}" for i in range(1, NUM_SPARSE + 1))]

#: Distinct values per categorical feature in Criteo Kaggle train.txt (45,840,617 rows), as counted by
#: the DLRM reference preprocessing (facebookresearch/dlrm, Kaggle ``day_fea_count``); the table sizes of
#: the paper-size DLRM.
KAGGLE_TABLE_SIZES = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
                      14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)

_HEX = np.full(256, 255, dtype=np.uint64)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF", start=10):
    _HEX[_c] = _i


class CriteoFormatError(ValueError):
    """A malformed line; the message names the file and line."""


def read(path: str | Path, table_sizes: list[int] | tuple[int, ...], max_rows: int | None = None
         ) -> dict[str, torch.Tensor]:
    """``dense`` (n, 13) float32, ``sparse`` (n, 26) int32 table indices, ``labels`` (n,) float32."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Criteo file not found: {path}")
    if len(table_sizes) != NUM_SPARSE:
        raise ValueError(f"need {NUM_SPARSE} table sizes, got {len(table_sizes)}")
    types = {"label": pa.int64(), **{c: pa.int64() for c in COLUMNS[1:1 + NUM_DENSE]},
             **{c: pa.string() for c in COLUMNS[1 + NUM_DENSE:]}}
    try:
        reader = pacsv.open_csv(
            path, read_options=pacsv.ReadOptions(column_names=COLUMNS, block_size=1 << 24),
            parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False,
                                            ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(column_types=types))
        parts, offset = [], 0
        for batch in reader:
            if max_rows is not None and offset >= max_rows:
                break
            if max_rows is not None:
                batch = batch.slice(0, max_rows - offset)
            parts.append(_convert(batch, table_sizes, path, offset))
            offset += batch.num_rows
    except pa.ArrowInvalid as exc:
        raise _locate(path, exc) from exc
    if not parts:
        raise CriteoFormatError(f"{path}: no examples")
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def _convert(batch: pa.RecordBatch, table_sizes, path: Path, offset: int) -> dict[str, torch.Tensor]:
    labels = batch.column("label")
    bad = pc.invert(pc.fill_null(pc.is_in(labels, pa.array([0, 1])), False))
    if pc.any(bad).as_py():
        row = int(np.flatnonzero(bad.to_numpy(zero_copy_only=False))[0])
        value = labels[row].as_py()
        what = "label is empty (a blank line?)" if value is None else f"label {value!r} is not 0 or 1"
        raise CriteoFormatError(f"{path}:{offset + row + 1}: {what}")
    dense = np.stack([batch.column(c).fill_null(0).to_numpy() for c in COLUMNS[1:1 + NUM_DENSE]], axis=1)
    dense = np.log1p(np.maximum(dense, 0).astype(np.float64)).astype(np.float32)
    sparse = np.stack([_hex_to_index(batch.column(c), size, path, offset, c)
                       for c, size in zip(COLUMNS[1 + NUM_DENSE:], table_sizes)], axis=1)
    return {"dense": torch.from_numpy(dense), "sparse": torch.from_numpy(sparse),
            "labels": torch.from_numpy(labels.to_numpy().astype(np.float32))}


def _hex_to_index(column: pa.Array, size: int, path: Path, offset: int, name: str) -> np.ndarray:
    lengths = pc.fill_null(pc.binary_length(column), 0).to_numpy()
    if lengths.size and lengths.max() > 16:
        row = int(np.argmax(lengths > 16))
        raise CriteoFormatError(f"{path}:{offset + row + 1}: {name} value {column[row].as_py()!r} is longer "
                                "than 16 hex digits")
    column = column.fill_null("")
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    _, offsets_buf, data_buf = column.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[column.offset:column.offset + len(column) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(1, np.uint8)
    starts = offsets[:-1].astype(np.int64)
    value = np.zeros(len(column), dtype=np.uint64)
    for j in range(int(lengths.max(initial=0))):
        present = lengths > j
        nibble = _HEX[data[np.minimum(starts + j, len(data) - 1)]]
        invalid = present & (nibble == 255)
        if invalid.any():
            row = int(np.argmax(invalid))
            raise CriteoFormatError(f"{path}:{offset + row + 1}: {name} value {column[row].as_py()!r} "
                                    "is not hexadecimal")
        value = np.where(present, value * np.uint64(16) + nibble, value)
    return (value % np.uint64(size)).astype(np.int32)


def _locate(path: Path, exc: Exception) -> CriteoFormatError:
    """Finds the first line that breaks the format (pyarrow's own message names no line number)."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != len(COLUMNS):
                return CriteoFormatError(f"{path}:{lineno}: {len(fields)} tab-separated fields, expected "
                                         f"{len(COLUMNS)} (label, 13 integer, 26 categorical)")
            for name, value in zip(COLUMNS[:1 + NUM_DENSE], fields):
                if value and not value.lstrip("-").isdigit():
                    return CriteoFormatError(f"{path}:{lineno}: {name} value {value!r} is not an integer")
    return CriteoFormatError(f"{path}: cannot parse as Criteo format: {exc}")


def write_synthetic(path: str | Path, num_rows: int, *, categories: list[int] | tuple[int, ...],
                    seed: int = 0, missing_rate: float = 0.05, base_rate: float = 0.25) -> dict[str, float]:
    """Writes ``num_rows`` Criteo-format lines with a planted signal, so accuracy and NCE mean something.

    Feature ``i`` takes one of ``categories[i]`` values with Zipf-like frequencies. The click
    probability is ``sigmoid(b + sum_i w_i[c_i] + sum_j v_j z_j + u[c_0] u[c_1])``: per-category weights
    (std 1) on the even-numbered categorical features C1, C3, ..., C11, weights (std 1) on the
    standardized log of the first five integer features, and one pairwise term (which a dot-product
    interaction can express); ``b`` sets the mean click rate to ``base_rate``. Values go missing
    independently with probability ``missing_rate``.

    Returns the generating model's own scores on the written rows (``oracle_accuracy``, ``oracle_nce``):
    what a perfect model could reach, up to the information lost in missing values.
    """
    if len(categories) != NUM_SPARSE:
        raise ValueError(f"need {NUM_SPARSE} category counts, got {len(categories)}")
    rng = np.random.default_rng(seed)
    n = num_rows
    cats = np.empty((n, NUM_SPARSE), dtype=np.int64)
    for i, k in enumerate(categories):
        freq = 1.0 / np.arange(1, k + 1) ** 1.05
        cats[:, i] = rng.choice(k, size=n, p=freq / freq.sum())
    counts = np.floor(rng.lognormal(mean=1.0, sigma=1.5, size=(n, NUM_DENSE))).astype(np.int64)
    z = np.log1p(counts)
    z = (z - z.mean(0)) / (z.std(0) + 1e-9)
    logit = z[:, :5] @ rng.normal(0.0, 1.0, size=5)
    for i in range(0, 12, 2):
        logit += rng.normal(0.0, 1.0, size=categories[i])[cats[:, i]]
    pair_u, pair_v = rng.normal(0.0, 1.0, size=categories[0]), rng.normal(0.0, 1.0, size=categories[1])
    logit += pair_u[cats[:, 0]] * pair_v[cats[:, 1]]
    prob = 1.0 / (1.0 + np.exp(-(logit + _bias_for_rate(logit, base_rate))))
    labels = (rng.random(n) < prob).astype(np.int64)
    field_salt = np.uint64(97531) * np.arange(NUM_SPARSE, dtype=np.uint64)
    hashed = (cats.astype(np.uint64) * np.uint64(2654435761) + field_salt) % np.uint64(2**32)
    missing = rng.random((n, NUM_DENSE + NUM_SPARSE)) < missing_rate
    empty = pa.scalar("", pa.string())
    columns = [pa.array(labels).cast(pa.string())]
    for j in range(NUM_DENSE):
        columns.append(pc.if_else(pa.array(missing[:, j]), empty, pa.array(counts[:, j]).cast(pa.string())))
    for i in range(NUM_SPARSE):
        columns.append(pc.if_else(pa.array(missing[:, NUM_DENSE + i]), empty, _hex8(hashed[:, i])))
    rows = pc.binary_join_element_wise(*columns, "\t")
    one_list = pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), rows)
    text = pc.binary_join(one_list, "\n")[0].as_py() + "\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: tmp.write_text(text))
    rate = labels.mean()
    p = np.clip(prob, 1e-12, 1 - 1e-12)
    bce = -np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p))
    entropy = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
    return {"oracle_accuracy": float(np.mean((prob >= 0.5) == labels)), "oracle_nce": float(bce / entropy),
            "click_rate": float(rate)}


def _hex8(values: np.ndarray) -> pa.Array:
    """Eight lower-case hex digits of each value < 2**32 (vectorized)."""
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    shifts = np.arange(28, -1, -4, dtype=np.uint64)
    chars = digits[((values[:, None] >> shifts) & np.uint64(15)).astype(np.intp)]
    return pa.array(np.ascontiguousarray(chars).view("S8").ravel()).cast(pa.string())


def _bias_for_rate(logit: np.ndarray, rate: float) -> float:
    """The offset b with mean(sigmoid(logit + b)) == rate (bisection)."""
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if np.mean(1.0 / (1.0 + np.exp(-(logit + mid)))) < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
