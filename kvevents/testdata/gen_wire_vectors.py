#!/usr/bin/python3
"""Writes the golden KV-event payloads: wire_vectors.json (read by the
kvevents decoder and encoder tests) and
kvevents/zmqtransport/testdata/interop/wire_payloads.json (sent through a
real socket by the zmqtransport tests).

vLLM (vllm/distributed/kv_events.py) encodes an event batch with msgspec:
EventBatch is array-like, [ts, events, data_parallel_rank] ([ts, events]
in v0.9.0); each event is tagged with its class name and is either
array-like, [tag, every field in declaration order], or (vLLM >= 0.24) a
map, {"type": tag, field: value, ...} in declaration order with
omit_defaults dropping fields that have a default and hold it (None).
msgspec writes ints in their smallest form, floats as float64, strings as
str, bytes as bin and None as nil; msgpack.packb(use_bin_type=True) writes
exactly the same bytes for these values. msgspec is not packaged in
Debian, so it is not run here: the payloads were compared with msgspec
0.19.0 when the vectors were first made (MSGSPEC_CHECKED records which),
and --check keeps the bytes unchanged since.

The three block hashes are those of tokens 0..47, block size 16,
sha256_cbor, PYTHONHASHSEED "0": sha256 of canonical CBOR of
(parent digest, tuple(block tokens), None), chained from NONE_HASH =
sha256(cbor("0")). Events carry a digest as its last 8 bytes read as an
unsigned big-endian int, or (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) as
the raw 32 bytes.

Needs Debian's python3 with python3-msgpack and python3-cbor2:
    /usr/bin/python3 kvevents/testdata/gen_wire_vectors.py          # rewrite both files
    /usr/bin/python3 kvevents/testdata/gen_wire_vectors.py --check  # exit 1 if either differs
"""
import difflib
import hashlib
import importlib.metadata
import json
import os
import platform
import sys

import cbor2
import msgpack

GENERATOR = "kvevents/testdata/gen_wire_vectors.py"
HERE = os.path.dirname(os.path.abspath(__file__))
WIRE_VECTORS = os.path.join(HERE, "wire_vectors.json")
WIRE_PAYLOADS = os.path.join(HERE, "..", "zmqtransport", "testdata", "interop", "wire_payloads.json")
MSGSPEC_CHECKED = ("payload bytes compared with msgspec 0.19.0 encoding vLLM's structs, identical for: "
                   "map_events_current, array_events_all_fields, map_events_bytes_hashes, small_example, "
                   "small_example_array (array_events_v0_9_0 was not compared)")

# Field names in declaration order, and which of them have a default.
STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                 "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"]
STORED_DEFAULTED = {"extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
REMOVED_FIELDS = ["block_hashes", "medium", "group_idx"]
REMOVED_DEFAULTED = {"group_idx"}
FIELDS = {"BlockStored": (STORED_FIELDS, STORED_DEFAULTED), "BlockRemoved": (REMOVED_FIELDS, REMOVED_DEFAULTED),
          "AllBlocksCleared": ([], set())}


def as_map(tag, values):
    fields, defaulted = FIELDS[tag]
    event = {"type": tag}
    for f in fields:
        if f in defaulted and values.get(f) is None:
            continue
        event[f] = values.get(f)
    return event


def as_array(tag, values):
    return [tag] + [values.get(f) for f in FIELDS[tag][0]]


def range48_digests():
    def h(x):
        return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()
    parent, out = h("0"), []
    for i in range(3):
        parent = h((parent, tuple(range(16 * i, 16 * i + 16)), None))
        out.append(parent)
    return out


def event_int(d):
    return int.from_bytes(d, "big") & (2**64 - 1)


def as_int64(u):
    return u - 2**64 if u >= 2**63 else u


def stored(hashes, tokens, block_size):
    return {"block_hashes": hashes, "parent_block_hash": None, "token_ids": tokens, "block_size": block_size,
            "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [None] * len(hashes),
            "group_idx": 0, "kv_cache_spec_kind": "full_attention"}


def removed(hashes):
    return {"block_hashes": hashes, "medium": "GPU", "group_idx": 0}


def batches(digests):
    """name -> (note, batch as Python values)."""
    ints = [event_int(d) for d in digests]
    ts, toks = 1750000000.5, list(range(48))
    return {
        "map_events_current": (
            "vLLM main after PR #42892 (v0.24+ observed as map in v0.26): EventBatch array_like, events tagged "
            "maps, omit_defaults drops default-valued trailing-default fields",
            [ts, [as_map("BlockStored", stored(ints, toks, 16)), as_map("BlockRemoved", removed(ints[2:])),
                  as_map("AllBlocksCleared", {})], 0]),
        "array_events_all_fields": (
            "array_like events (pre-#42892, e.g. v0.22/v0.23 with group_idx+kv_cache_spec fields): all fields "
            "always present, nil for None",
            [ts, [as_array("BlockStored", stored(ints, toks, 16)), as_array("BlockRemoved", removed(ints[2:])),
                  as_array("AllBlocksCleared", {})], 0]),
        "array_events_v0_9_0": (
            "original schema (v0.9.0): EventBatch [ts, events], BlockStored [tag, hashes, parent, tokens, "
            "block_size, lora_id]",
            [ts, [["BlockStored", ints, None, toks, 16, None], ["BlockRemoved", ints[2:]], ["AllBlocksCleared"]]]),
        "map_events_bytes_hashes": (
            "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: hashes are 32-byte msgpack bin",
            [ts, [as_map("BlockStored", stored(digests, toks, 16)), as_map("BlockRemoved", removed(digests[2:]))], 0]),
        "small_example": (
            "byte-level walkthrough example in the doc (map events)",
            [1.5, [as_map("BlockStored", stored(ints[:1], [1, 2], 2))], 0]),
        "small_example_array": (
            "same content, array-like events with all fields",
            [1.5, [as_array("BlockStored", stored(ints[:1], [1, 2], 2))], 0]),
    }


def to_json(x):
    if isinstance(x, bytes):
        return {"$bytes": x.hex()}
    if isinstance(x, list):
        return [to_json(v) for v in x]
    if isinstance(x, dict):
        return {k: to_json(v) for k, v in x.items()}
    return x


def event_summary(event):
    """The event's tag and 64-bit block hashes, from either event shape."""
    tag = event["type"] if isinstance(event, dict) else event[0]
    hashes = event.get("block_hashes", []) if isinstance(event, dict) else (event[1] if len(event) > 1 else [])
    return {"kind": tag, "hashes": [event_int(h) if isinstance(h, bytes) else h for h in hashes]}


def libs():
    return {"msgpack": importlib.metadata.version("msgpack"), "cbor2": importlib.metadata.version("cbor2"),
            "python": platform.python_version()}


def build():
    digests = range48_digests()
    wire, payloads = {}, {}
    for name, (note, batch) in batches(digests).items():
        payload = msgpack.packb(batch, use_bin_type=True).hex()
        wire[name] = {"note": note, "payload_hex": payload, "decoded": to_json(batch)}
        payloads[name] = {"payload_hex": payload, "dp_rank": batch[2] if len(batch) > 2 else None,
                          "events": [event_summary(e) for e in batch[1]]}
    wire["zmq_frames_example"] = {
        "topic_hex": b"kv-events".hex(), "topic": "kv-events",
        "seq_0_hex": (0).to_bytes(8, "big").hex(), "seq_258_hex": (258).to_bytes(8, "big").hex(),
        "replay_end_seq_hex": (-1).to_bytes(8, "big", signed=True).hex(),
    }
    vectors = {
        "generator": GENERATOR,
        "libs": libs(),
        "msgspec_crosscheck": MSGSPEC_CHECKED,
        "wire": wire,
        "range48_sha256_cbor_seed0": {
            "tokens": list(range(48)),
            "blocks": [{"index": i, "hash_hex": d.hex(), "event_int": event_int(d),
                        "event_int_as_int64": as_int64(event_int(d))} for i, d in enumerate(digests)],
        },
    }
    transport = {
        "generator": GENERATOR,
        "libs": libs(),
        "contents": "the payloads of kvevents/testdata/wire_vectors.json, with only what the transport tests "
                    "need: payload hex, dp rank, and per event its tag and 64-bit block hashes",
        "payloads": payloads,
    }
    return {WIRE_VECTORS: vectors, WIRE_PAYLOADS: transport}


def render(doc):
    return json.dumps(doc, indent=1) + "\n"


def check(path, doc):
    """Compares the file with doc; the recorded library versions are a
    record, not a result, so they are taken from the file."""
    with open(path) as f:
        committed = f.read()
    name = os.path.relpath(path, os.path.join(HERE, "..", ".."))
    recorded = json.loads(committed).get("libs")
    if recorded != doc["libs"]:
        print(f"note: {name} made with {recorded}, checking with {doc['libs']}")
        doc = dict(doc, libs=recorded)
    if render(doc) == committed:
        print(f"{GENERATOR}: {name} is up to date")
        return True
    sys.stdout.writelines(list(difflib.unified_diff(
        committed.splitlines(True), render(doc).splitlines(True), "committed", "regenerated"))[:60])
    print(f"{GENERATOR}: {name} differs from what the generator computes")
    return False


def main():
    checking = sys.argv[1:] == ["--check"]
    if sys.argv[1:] and not checking:
        sys.exit("usage: gen_wire_vectors.py [--check]")
    docs = build()
    if checking:
        return 0 if all([check(path, doc) for path, doc in docs.items()]) else 1
    for path, doc in docs.items():
        with open(path, "w") as f:
            f.write(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
