#!/usr/bin/env python3
"""make_corpus.py — writes the seed corpora for the libFuzzer harnesses.

    python3 tests/fuzz/make_corpus.py        # from the repository root

tests/fuzz/corpus/fuzz_header/ gets small safetensors files, valid ones (as
the reference writer lays them out) and hostile ones, one per rule of
the reader (format/safetensors.c); tests/fuzz/corpus/fuzz_index/ gets index.json texts;
tests/fuzz/corpus/fuzz_rebuild/ gets stored files for the rebuild harness
(tensors as blobs, or as recipes given in __metadata__ "recipe.<name>").
File names say what each seed is. The output is deterministic and is
committed; rerun this after changing it. Standard library only.
"""

import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

# Bits per element, in the reference Dtype enum order (the writer sorts by it).
DTYPE_BITS = [
    ("BOOL", 8), ("F4", 4), ("F6_E2M3", 6), ("F6_E3M2", 6), ("U8", 8), ("I8", 8),
    ("F8_E5M2", 8), ("F8_E4M3", 8), ("F8_E8M0", 8), ("F8_E4M3FNUZ", 8), ("F8_E5M2FNUZ", 8),
    ("I16", 16), ("U16", 16), ("F16", 16), ("BF16", 16), ("I32", 32), ("U32", 32),
    ("F32", 32), ("C64", 64), ("F64", 64), ("I64", 64), ("U64", 64),
]
DTYPE_ORDER = {name: i for i, (name, _) in enumerate(DTYPE_BITS)}
BITS = dict(DTYPE_BITS)


def nbytes(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    return n * BITS[dtype] // 8


def frame(header: bytes, data: bytes = b"", pad: bool = True) -> bytes:
    """8-byte little-endian length, header, data; padded with spaces to 8 like the writer."""
    if pad:
        header += b" " * ((8 - len(header) % 8) % 8)
    return struct.pack("<Q", len(header)) + header + data


def write_safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape). Lays them out as the reference
    writer does (dtype descending, then name) with recognisable data bytes."""
    order = sorted(tensors, key=lambda t: (-DTYPE_ORDER[t[1]], t[0]))
    hdr = {}
    if metadata is not None:
        hdr["__metadata__"] = metadata
    off = 0
    for name, dtype, shape in order:
        size = nbytes(dtype, shape)
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + size]}
        off += size
    text = json.dumps(hdr, separators=(",", ":"), ensure_ascii=False).encode()
    return frame(text, bytes(i % 251 for i in range(off)))


def raw(header_obj_text: str, data_len: int = 0, pad: bool = True) -> bytes:
    """A file whose header is exactly this JSON text (for hand-made hostility)."""
    return frame(header_obj_text.encode("utf-8", "surrogatepass"), b"\x00" * data_len, pad)


def header_seeds():
    s = {}
    # ---- valid ----
    s["valid_empty"] = frame(b"{}")
    s["valid_empty_meta"] = write_safetensors([], {"format": "pt"})
    s["valid_one_f32"] = write_safetensors([("w", "F32", [2, 2])])
    s["valid_mixed_dtypes"] = write_safetensors(
        [("a.weight", "BF16", [4, 3]), ("a.bias", "F32", [3]), ("ids", "I64", [2]),
         ("mask", "BOOL", [5]), ("q", "U8", [7]), ("z", "F64", [1]), ("c", "C64", [2])],
        {"format": "pt", "note": "seed"})
    s["valid_scalar_and_empty"] = write_safetensors(
        [("scalar", "F32", []), ("empty", "F16", [0, 3]), ("zero_first", "I32", [3, 0])])
    s["valid_subbyte"] = write_safetensors(
        [("fp4", "F4", [2, 4]), ("fp6", "F6_E2M3", [4]), ("fp6b", "F6_E3M2", [8])])
    s["valid_fp8"] = write_safetensors(
        [(d.lower(), d, [3]) for d in ("F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
                                       "F8_E5M2FNUZ")])
    s["valid_unicode_names"] = write_safetensors([("modèle.poids", "F16", [2]), ("名", "U8", [1])])
    s["valid_unknown_entry_key"] = raw(
        '{"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"extra":{"x":[1,2]}}}', 2)
    s["valid_unpadded"] = raw('{"w":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}', 3,
                              pad=False)
    s["valid_out_of_name_order"] = raw(
        '{"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},'
        '"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 2)
    # ---- length prefix ----
    s["bad_too_small"] = b"\x08\x00\x00\x00\x00"
    s["bad_zero_length_file"] = b""
    s["bad_n_zero"] = struct.pack("<Q", 0)
    s["bad_header_too_large"] = struct.pack("<Q", 100_000_001) + b"{}"
    s["bad_huge_n"] = struct.pack("<Q", 1 << 63) + b"{}      "
    s["bad_n_max_u64"] = struct.pack("<Q", (1 << 64) - 1) + b"{}"
    s["bad_n_past_end"] = struct.pack("<Q", 64) + b'{"w":{"dtype":"U8"'
    s["bad_truncated_data"] = write_safetensors([("w", "F32", [4, 4])])[:-10]
    s["bad_trailing_bytes"] = write_safetensors([("w", "F32", [2])]) + b"JUNK"
    s["bad_empty_with_data"] = frame(b"{}", b"\x00" * 8)
    # ---- header text ----
    s["bad_utf8_ff"] = frame(b'{"\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x00")
    s["bad_utf8_overlong"] = frame(b'{"\xc0\xaf":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
                                   b"\x00")
    s["bad_utf8_surrogate"] = frame(
        b'{"\xed\xa0\x80":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x00")
    s["bad_utf8_truncated_seq"] = frame(b'{"a\xe2\x82":{}}')
    s["bad_nul_in_header"] = frame(b'{"a\x00b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
                                   b"\x00")
    s["bad_escaped_nul_name"] = raw('{"a\\u0000b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
                                    1)
    s["bad_not_json"] = frame(b"this is not json")
    s["bad_json_array"] = frame(b"[]")
    s["bad_json_string"] = frame(b'"{}"')
    s["bad_json_null"] = frame(b"null")
    s["bad_json_trailing_garbage"] = frame(b"{} x")
    s["bad_json_two_objects"] = frame(b"{}{}")
    s["bad_deep_nesting"] = frame(b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}")
    s["bad_entry_not_object"] = raw('{"w":[1,2,3]}')
    s["bad_missing_dtype"] = raw('{"w":{"shape":[1],"data_offsets":[0,1]}}', 1)
    s["bad_missing_offsets"] = raw('{"w":{"dtype":"U8","shape":[1]}}', 1)
    # ---- dtype ----
    s["bad_unknown_dtype"] = raw('{"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}', 16)
    s["bad_lowercase_dtype"] = raw('{"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}}', 4)
    s["bad_dtype_number"] = raw('{"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}}', 4)
    # ---- shape ----
    s["bad_shape_size_mismatch"] = raw('{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}}',
                                       12)
    s["bad_shape_overflow"] = raw(
        '{"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],'
        '"data_offsets":[0,0]}}')
    s["bad_shape_bits_overflow"] = raw(
        '{"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}}')
    s["bad_shape_overflow_then_zero"] = raw(
        '{"w":{"dtype":"U8","shape":[9223372036854775808,4,0],"data_offsets":[0,0]}}')
    s["bad_shape_negative"] = raw('{"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}', 1)
    s["bad_shape_float"] = raw('{"w":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}}', 2)
    s["bad_shape_not_list"] = raw('{"w":{"dtype":"U8","shape":3,"data_offsets":[0,3]}}', 3)
    s["bad_shape_huge_number"] = raw(
        '{"w":{"dtype":"U8","shape":[99999999999999999999999],"data_offsets":[0,1]}}', 1)
    s["bad_rank_17"] = raw('{"w":{"dtype":"U8","shape":[' + ",".join(["1"] * 17) +
                           '],"data_offsets":[0,1]}}', 1)
    s["bad_misaligned_f4"] = raw('{"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}', 2)
    s["bad_misaligned_f6"] = raw('{"w":{"dtype":"F6_E3M2","shape":[1],"data_offsets":[0,1]}}', 1)
    # ---- offsets ----
    s["bad_offsets_overlap"] = raw(
        '{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},'
        '"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}', 24)
    s["bad_offsets_gap"] = raw(
        '{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},'
        '"b":{"dtype":"F32","shape":[4],"data_offsets":[20,36]}}', 36)
    s["bad_offsets_not_from_zero"] = raw('{"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}', 8)
    s["bad_offsets_end_before_begin"] = raw(
        '{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},'
        '"b":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}', 4)
    s["bad_offsets_three"] = raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}', 2)
    s["bad_offsets_negative"] = raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}}')
    s["bad_offsets_huge"] = raw(
        '{"a":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]}}')
    s["bad_offsets_wrap"] = raw(
        '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
        '"b":{"dtype":"U8","shape":[18446744073709551615],'
        '"data_offsets":[1,18446744073709551615]}}', 2)
    s["valid_zero_size_same_start"] = raw(
        '{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},'
        '"b":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},'
        '"c":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', 2)
    # ---- names and metadata ----
    s["bad_duplicate_names"] = raw(
        '{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
        '"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', 2)
    s["bad_metadata_not_object"] = raw('{"__metadata__":"x"}')
    s["bad_metadata_number_value"] = raw('{"__metadata__":{"format":1}}')
    s["bad_metadata_nested"] = raw('{"__metadata__":{"format":{"a":"b"}}}')
    s["bad_metadata_duplicate"] = raw('{"__metadata__":{"a":"1"},"__metadata__":{"a":"2"}}')
    s["bad_metadata_as_tensor"] = raw(
        '{"__metadata__":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1)
    return s


def index_text(weight_map, metadata=None, indent=2):
    obj = {}
    if metadata is not None:
        obj["metadata"] = metadata
    obj["weight_map"] = weight_map
    return (json.dumps(obj, indent=indent, sort_keys=True) + "\n").encode()


def index_seeds():
    two = {"a.weight": "model-00001-of-00002.safetensors",
           "b.weight": "model-00002-of-00002.safetensors",
           "c.bias": "model-00002-of-00002.safetensors"}
    s = {}
    # ---- valid ----
    s["valid_two_shards"] = index_text(two, {"total_size": 4096})
    s["valid_no_metadata"] = index_text(two)
    s["valid_extra_metadata"] = index_text(two, {"total_size": 12, "format": "pt", "n": [1]})
    s["valid_empty_map"] = index_text({}, {"total_size": 0})
    s["valid_compact"] = index_text({"x": "model.safetensors"}, {"total_size": 8}, indent=None)
    s["valid_subdir_shard"] = index_text({"x": "shards/model-00001-of-00001.safetensors"})
    s["edge_dots_in_name"] = index_text({"x": "model..v2.safetensors", "y": "./m.safetensors"})
    # ---- unsafe shard names ----
    for label, name in [("dotdot", "../x.safetensors"), ("dotdot_mid", "sub/../../x.safetensors"),
                        ("dotdot_only", ".."), ("dotdot_end", "sub/.."),
                        ("absolute", "/etc/passwd"), ("url", "http://evil.example/x.safetensors"),
                        ("file_url", "file:///etc/passwd"), ("backslash", "..\\x.safetensors"),
                        ("nul", "model\u0000.safetensors"), ("empty", "")]:
        s["bad_shard_" + label] = index_text({"a": "model.safetensors", "b": name})
    # ---- shape of the document ----
    s["bad_empty_input"] = b""
    s["bad_not_json"] = b"weight_map: nope"
    s["bad_truncated"] = index_text(two, {"total_size": 4096})[:40]
    s["bad_top_array"] = b"[]"
    s["bad_no_weight_map"] = b'{"metadata":{"total_size":1}}'
    s["bad_weight_map_array"] = b'{"weight_map":["a","b"]}'
    s["bad_file_number"] = b'{"weight_map":{"a":1}}'
    s["bad_file_null"] = b'{"weight_map":{"a":null}}'
    s["bad_metadata_array"] = b'{"metadata":[],"weight_map":{}}'
    s["bad_total_size_string"] = b'{"metadata":{"total_size":"12"},"weight_map":{}}'
    s["bad_total_size_negative"] = b'{"metadata":{"total_size":-1},"weight_map":{}}'
    s["bad_total_size_float"] = b'{"metadata":{"total_size":1.5},"weight_map":{}}'
    s["bad_total_size_huge"] = (b'{"metadata":{"total_size":99999999999999999999999},'
                                b'"weight_map":{}}')
    s["bad_duplicate_tensor"] = (b'{"weight_map":{"a":"model-00001-of-00002.safetensors",'
                                 b'"a":"model-00002-of-00002.safetensors"}}')
    s["bad_utf8_name"] = b'{"weight_map":{"\xff\xfe":"model.safetensors"}}'
    s["bad_utf8_file"] = b'{"weight_map":{"a":"model\xc0\xaf.safetensors"}}'
    s["bad_deep_nesting"] = b'{"metadata":' + b"[" * 5000 + b"]" * 5000 + b',"weight_map":{}}'
    s["bad_trailing_garbage"] = index_text(two) + b"}"
    s["bad_nul_byte"] = b'{"weight_map":{"a":"model.safetensors"}}\x00{}'
    return s


BLOB = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def rebuild_seeds():
    """Stored files for fuzz_rebuild: a tensor is a blob unless __metadata__
    holds "recipe.<name>" (its parts, as a converted layout's catalog row)."""
    s = {}
    s["ok_blobs"] = write_safetensors([("a", "F32", [2, 3]), ("b", "BF16", [4]), ("c", "U8", [])])
    halves = [
        {"blob": BLOB, "dtype": "F32", "shape": [2, 2], "lo": [0, 0], "ext": [2, 2], "src_lo": [0, 0],
         "axis_map": [0, 1]},
        {"zero": True, "lo": [0, 2], "ext": [2, 1]},
    ]
    s["ok_recipe"] = write_safetensors([("w", "F32", [2, 3])], {"recipe.w": json.dumps(halves)})
    transposed = [{"blob": BLOB, "dtype": "F16", "shape": [3, 2], "lo": [0, 0], "ext": [2, 3],
                   "src_lo": [0, 0], "axis_map": [1, 0]}]
    s["ok_recipe_transpose"] = write_safetensors([("t", "F16", [2, 3])], {"recipe.t": json.dumps(transposed)})
    s["ok_rank8"] = write_safetensors([("r8", "U8", [1, 1, 1, 1, 1, 1, 1, 2])])
    deep = {"deep": {"dtype": "U8", "shape": [0] + [2**63] * 8, "data_offsets": [0, 0]}}
    s["bad_rank9_zero_dim"] = frame(json.dumps(deep).encode())
    deep16 = {"deep": {"dtype": "U8", "shape": [0] + [2**64 - 1] * 15, "data_offsets": [0, 0]}}
    s["bad_rank16_zero_dim"] = frame(json.dumps(deep16).encode())
    bad_part = [{"blob": BLOB, "dtype": "U8", "shape": [1] * 12, "lo": [0], "ext": [2], "src_lo": [0],
                 "axis_map": [0]}]
    s["bad_recipe_deep_source"] = write_safetensors([("p", "U8", [2])], {"recipe.p": json.dumps(bad_part)})
    s["bad_recipe_not_json"] = write_safetensors([("p", "U8", [2])], {"recipe.p": "[{"})
    return s


def write_dir(name, seeds):
    out = os.path.join(CORPUS, name)
    os.makedirs(out, exist_ok=True)
    for old in os.listdir(out):
        os.remove(os.path.join(out, old))
    for label, data in sorted(seeds.items()):
        with open(os.path.join(out, label), "wb") as f:
            f.write(data)
    return len(seeds)


def main():
    n1 = write_dir("fuzz_header", header_seeds())
    n2 = write_dir("fuzz_index", index_seeds())
    n3 = write_dir("fuzz_rebuild", rebuild_seeds())
    print(f"wrote {n1} header seeds, {n2} index seeds and {n3} rebuild seeds under {os.path.relpath(CORPUS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
