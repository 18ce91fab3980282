"""Reading a Mantissa checkpoint (safetensors) without numpy, for the tests and tools that
compare runs: its tensors as raw bytes by name, and the training state in its metadata."""
import json
import struct


def _header(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    return data, n, json.loads(data[8:8 + n])


def tensors(path):
    """The tensors' bytes by name, in the file's order (the metadata left out)."""
    data, n, header = _header(path)
    return {k: data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}


def state(path):
    """The training state: step, epoch, batch (within the epoch), generator, train_seconds."""
    return json.loads(_header(path)[2]["__metadata__"]["mantissa.state"])


def differing(a_path, b_path):
    """What differs between two checkpoints' tensors: the names whose bytes differ or that only
    one has, and "(order)" when the same names come in another order. Empty: byte-identical."""
    a, b = tensors(a_path), tensors(b_path)
    out = [k for k in a if a[k] != b.get(k)] + [k for k in b if k not in a]
    if not out and list(a) != list(b):
        out.append("(order)")
    return out
