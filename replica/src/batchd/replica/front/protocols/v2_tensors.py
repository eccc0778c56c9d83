"""Open Inference Protocol (V2) tensors <-> batch items, as pure functions.

The first dimension of every input tensor is the batch: row `i` of each input becomes item `i`.
With one input the item is the row itself; with several it is `{input_name: row}`. Results go
back the same way: one output tensor (or one per key when results are dicts), first dimension
the batch, data flattened row-major as the protocol specifies.

Tensor data travels as JSON lists, or, with the binary tensor data extension that tritonclient
uses by default, as raw little-endian bytes after the JSON header: the header's length is in
`Inference-Header-Content-Length`, each binary tensor says its `parameters.binary_data_size`,
and BYTES elements are each a 4-byte little-endian length and the bytes. A request asks for
binary answers with `parameters.binary_data_output` or per output `parameters.binary_data`.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchd.api.spec import TensorSpec
from batchd.replica.errors import InvalidInput

_INT_TYPES = {"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"}
_FLOAT_TYPES = {"FP16", "FP32", "FP64"}
DATATYPES = _INT_TYPES | _FLOAT_TYPES | {"BOOL", "BYTES"}
# Fixed-size datatypes as numpy reads and writes them on the wire (little-endian).
_WIRE: dict[str, str] = {
    "BOOL": "?",
    "UINT8": "<u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "<i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """The JSON header and the binary tensor data of a request (all JSON without the header)."""
    if header_length is None:
        return body, b""
    try:
        length = int(header_length)
    except ValueError:
        length = -1
    if not 0 <= length <= len(body):
        raise InvalidInput(
            f"Inference-Header-Content-Length: expected 0..{len(body)} (the body's size), "
            f"got {header_length!r}"
        )
    return body[:length], body[length:]


def decode_inputs(body: Any, binary: bytes = b"") -> list[Any]:
    """The batch items of an inference request body (JSON header, then any binary tensor data),
    or InvalidInput naming what is wrong."""
    if not isinstance(body, dict):
        raise InvalidInput(f"request body: expected a JSON object with 'inputs', got {type(body).__name__}")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidInput(f"inputs: expected a non-empty list of tensors, got {_short(inputs)}")
    columns: dict[str, list[Any]] = {}
    batch_size: int | None = None
    offset = 0
    for index, tensor in enumerate(inputs):
        where = f"inputs[{index}]"
        name, rows, offset = _decode_tensor(tensor, where, binary, offset)
        if name in columns:
            raise InvalidInput(f"{where}.name: {name!r} appears twice")
        if batch_size is not None and len(rows) != batch_size:
            raise InvalidInput(
                f"{where}.shape: first dimension {len(rows)} differs from the other inputs' {batch_size}"
            )
        batch_size = len(rows)
        columns[name] = rows
    if offset != len(binary):
        raise InvalidInput(
            f"request body: {len(binary) - offset} byte(s) of binary data that no input claims"
        )
    if not batch_size:
        raise InvalidInput("inputs: the batch is empty (first dimension 0)")
    if len(columns) == 1:
        return next(iter(columns.values()))
    return [{name: rows[i] for name, rows in columns.items()} for i in range(batch_size)]


def _decode_tensor(tensor: Any, where: str, binary: bytes, offset: int) -> tuple[str, list[Any], int]:
    if not isinstance(tensor, dict):
        raise InvalidInput(
            f"{where}: expected an object with name, shape, datatype, data, got {_short(tensor)}"
        )
    name, shape, datatype, data = (tensor.get(key) for key in ("name", "shape", "datatype", "data"))
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"{where}.name: expected a non-empty string, got {_short(name)}")
    if not isinstance(shape, list) or not shape or not all(_is_dim(d) for d in shape):
        raise InvalidInput(f"{where}.shape: expected a list of non-negative integers, got {_short(shape)}")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise InvalidInput(f"{where}.datatype: expected one of {sorted(DATATYPES)}, got {_short(datatype)}")
    size = _parameters(tensor, where).get("binary_data_size")
    if size is not None:
        if not _is_dim(size) or offset + size > len(binary):
            raise InvalidInput(
                f"{where}.parameters.binary_data_size: {_short(size)} bytes, but "
                f"{len(binary) - offset} byte(s) of binary data are left"
            )
        data = _from_wire(binary[offset : offset + size], datatype, where)
        offset += size
    elif not isinstance(data, list):
        raise InvalidInput(f"{where}.data: expected a list (or binary data), got {_short(data)}")
    flat = _flatten(data)
    expected = math.prod(shape)
    if len(flat) != expected:
        raise InvalidInput(f"{where}.data: shape {shape} needs {expected} element(s), got {len(flat)}")
    for position, value in enumerate(flat):
        if not _fits(value, datatype):
            raise InvalidInput(f"{where}.data[{position}]: {_short(value)} is not a valid {datatype}")
    return name, _reshape(flat, shape), offset


def _from_wire(raw: bytes, datatype: str, where: str) -> list[Any]:
    """Binary tensor data as a flat list of Python values."""
    if datatype != "BYTES":
        width = np.dtype(_WIRE[datatype]).itemsize
        if len(raw) % width:
            raise InvalidInput(f"{where}: {len(raw)} byte(s) of {datatype} data, not a multiple of {width}")
        values: list[Any] = np.frombuffer(raw, dtype=_WIRE[datatype]).tolist()
        return values
    elements, position = [], 0
    while position < len(raw):
        if position + 4 > len(raw):
            raise InvalidInput(f"{where}: BYTES data ends inside an element's 4-byte length")
        (length,) = struct.unpack_from("<I", raw, position)
        element = raw[position + 4 : position + 4 + length]
        if len(element) != length:
            raise InvalidInput(f"{where}: a BYTES element claims {length} byte(s), {len(element)} are left")
        try:
            elements.append(element.decode())
        except UnicodeDecodeError:
            raise InvalidInput(f"{where}: BYTES element {len(elements)} is not UTF-8 text") from None
        position += 4 + length
    return elements


def _to_wire(flat: list[Any], datatype: str) -> bytes:
    if datatype != "BYTES":
        return bytes(np.asarray(flat, dtype=_WIRE[datatype]).tobytes())
    encoded = [value.encode() if isinstance(value, str) else bytes(value) for value in flat]
    return b"".join(struct.pack("<I", len(element)) + element for element in encoded)


@dataclass(frozen=True)
class Wanted:
    """What a request asks of its answer: which outputs, and which of them in binary."""

    names: tuple[str, ...] | None  # None: every output
    binary: frozenset[str]
    all_binary: bool


def wanted_outputs(request: dict[str, Any]) -> Wanted:
    """Read (and check, before the model runs) the request's `outputs` and `binary_data_output`."""
    all_binary = bool(_parameters(request, "request body").get("binary_data_output"))
    outputs = request.get("outputs")
    if outputs is None:
        return Wanted(None, frozenset(), all_binary)
    if not isinstance(outputs, list):
        raise InvalidInput(f'outputs: expected a list of {{"name": ...}} objects, got {_short(outputs)}')
    names, binary = [], set()
    for index, output in enumerate(outputs):
        if not isinstance(output, dict) or not isinstance(output.get("name"), str):
            raise InvalidInput(f'outputs[{index}]: expected {{"name": ...}}, got {_short(output)}')
        names.append(output["name"])
        if _parameters(output, f"outputs[{index}]").get("binary_data"):
            binary.add(output["name"])
    return Wanted(tuple(names) if names else None, frozenset(binary), all_binary)


def shape_answer(outputs: list[dict[str, Any]], wanted: Wanted) -> tuple[list[dict[str, Any]], bytes]:
    """The outputs the request asked for, those it wanted in binary moved out of the JSON:
    (outputs, their bytes, in order)."""
    if wanted.names is not None:
        by_name = {output["name"]: output for output in outputs}
        unknown = [name for name in wanted.names if name not in by_name]
        if unknown:
            raise InvalidInput(f"outputs: no output named {unknown[0]!r}; the model has {sorted(by_name)}")
        outputs = [by_name[name] for name in wanted.names]
    answered, chunks = [], []
    for output in outputs:
        if not (wanted.all_binary or output["name"] in wanted.binary):
            answered.append(output)
            continue
        raw = _to_wire(output["data"], output["datatype"])
        chunks.append(raw)
        header = {key: value for key, value in output.items() if key != "data"}
        answered.append(header | {"parameters": {"binary_data_size": len(raw)}})
    return answered, b"".join(chunks)


def _parameters(holder: dict[str, Any], where: str) -> dict[str, Any]:
    """The `parameters` object of a request, tensor or output (empty when absent)."""
    parameters = holder.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise InvalidInput(f"{where}.parameters: expected an object, got {_short(parameters)}")
    return parameters


def _is_dim(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _fits(value: Any, datatype: str) -> bool:
    if datatype == "BYTES":
        return isinstance(value, str)
    if datatype == "BOOL":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if datatype in _INT_TYPES:
        return isinstance(value, int) and (value >= 0 or not datatype.startswith("U"))
    return isinstance(value, (int, float))


def _flatten(data: list[Any]) -> list[Any]:
    if not any(isinstance(value, list) for value in data):
        return data
    flat: list[Any] = []
    for value in data:
        flat.extend(_flatten(value) if isinstance(value, list) else [value])
    return flat


def _reshape(flat: list[Any], shape: list[int]) -> list[Any]:
    """Nest a flat row-major list into `shape`; with shape [N, ...] that gives the N batch items."""
    if len(shape) == 1:
        return flat
    step = math.prod(shape[1:])
    return [_reshape(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def encode_outputs(results: Sequence[Any], declared: Sequence[TensorSpec]) -> list[dict[str, Any]]:
    """Output tensors for a batch of results (one result per item), named and typed as the model declares."""
    declared_types = {spec.name: spec.datatype for spec in declared}
    if results and all(isinstance(r, dict) for r in results):
        keys = list(results[0])
        if all(list(r) == keys for r in results):
            return [_encode_column(key, [r[key] for r in results], declared_types.get(key)) for key in keys]
    name = declared[0].name if declared else "output"
    return [_encode_column(name, list(results), declared_types.get(name))]


def _encode_column(name: str, values: list[Any], declared: str | None) -> dict[str, Any]:
    shape = _rectangular_shape(values)
    flat = _flatten(values) if shape is not None else []
    datatype = _datatype_of(flat) if shape is not None else None
    if declared and datatype and _family(declared) == _family(datatype):
        datatype = declared  # e.g. FP32 embeddings, which JSON carries as plain floats
    if shape is None or datatype is None:  # ragged, structured or mixed rows travel as JSON strings
        data = [v if isinstance(v, str) else json.dumps(v) for v in values]
        return {"name": name, "shape": [len(values)], "datatype": "BYTES", "data": data}
    return {"name": name, "shape": shape, "datatype": datatype, "data": flat}


def _rectangular_shape(values: list[Any]) -> list[int] | None:
    """[len(values), *inner] when every row has the same nested list shape of scalars, else None."""
    inner: list[int] | None = None
    for value in values:
        shape = _shape_of(value)
        if shape is None or (inner is not None and shape != inner):
            return None
        inner = shape
    return [len(values), *(inner or [])]


def _shape_of(value: Any) -> list[int] | None:
    if isinstance(value, list):
        if not value:
            return [0]
        shapes = [_shape_of(v) for v in value]
        first = shapes[0]
        if first is None or any(s != first for s in shapes):
            return None
        return [len(value), *first]
    return [] if isinstance(value, (bool, int, float, str)) else None


def _datatype_of(flat: list[Any]) -> str | None:
    if flat and all(isinstance(v, bool) for v in flat):
        return "BOOL"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        return "INT64"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
        return "FP64"
    if all(isinstance(v, str) for v in flat):
        return "BYTES"
    return None


def _family(datatype: str) -> str:
    return "float" if datatype in _FLOAT_TYPES else "int" if datatype in _INT_TYPES else datatype


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
