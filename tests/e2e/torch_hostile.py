#!/usr/bin/env python3
"""torch_hostile.py — hostile torch.save files for test_torch.sh, and the
fuzzers' seed corpus. Stdlib only: the pickles are written byte by byte, the
zips by zipfile or by hand where zipfile would not lie.

  torch_hostile.py DIR MARKER   writes DIR/<case>.pt files and DIR/cases.txt:
                                one "<file>\t<substring the error must hold>"
                                a line. MARKER is a path that any pickle
                                which managed to run code would create.
"""
import struct
import sys
import zipfile

PROTO2 = b"\x80\x02"


def u(s):  # BINUNICODE
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def glob(mod, name):
    return b"c" + mod.encode() + b"\n" + name.encode() + b"\n"


def storage_pid(key, numel, typ="FloatStorage"):
    return b"(" + u("storage") + glob("torch", typ) + u(key) + u("cpu") + b"J" + struct.pack("<i", numel) + b"tQ"


def tensor(key, numel, offset, size, stride, typ="FloatStorage"):
    def tup(xs):
        return b"(" + b"".join(b"J" + struct.pack("<i", x) for x in xs) + b"t"
    return (glob("torch._utils", "_rebuild_tensor_v2") + b"(" + storage_pid(key, numel, typ) +
            b"J" + struct.pack("<i", offset) + tup(size) + tup(stride) + b"\x89" +
            glob("collections", "OrderedDict") + b")R" + b"tR")


def state_dict(*items):
    return PROTO2 + b"}(" + b"".join(u(k) + v for k, v in items) + b"u."


def torch_zip(path, pkl, storages, compress=None):
    """A zip laid out as torch.save's: archive/data.pkl, archive/data/<key>, archive/version."""
    def info(name):  # a fixed date: the files (and the fuzz corpus) are the same every run
        return zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(info("archive/data.pkl"), pkl)
        for key, data in storages.items():
            z.writestr(info("archive/data/" + key), data, compress_type=compress or zipfile.ZIP_STORED)
        z.writestr(info("archive/version"), b"3\n")


def main(d, marker):
    cases = []

    def case(name, want, pkl=None, storages=None, raw=None, **kw):
        path = f"{d}/{name}"
        if raw is not None:
            open(path, "wb").write(raw)
        else:
            torch_zip(path, pkl, storages if storages is not None else {"0": b"\0" * 16}, **kw)
        cases.append(f"{name}\t{want}")

    good = tensor("0", 4, 0, [4], [1])
    # code execution, every route pickle has
    case("reduce_os_system.pt", "global 'os.system' is not allowed",
         PROTO2 + glob("os", "system") + b"(" + u(f"touch {marker}") + b"tR.")
    case("reduce_posix_system.pt", "global 'posix.system'",
         state_dict(("w", glob("posix", "system") + b"(" + u(f"touch {marker}") + b"tR")))
    case("eval.pt", "global 'builtins.eval'",
         PROTO2 + glob("builtins", "eval") + b"(" + u(f"open('{marker}','w')") + b"tR.")
    case("subprocess.pt", "global 'subprocess.Popen'",
         PROTO2 + glob("subprocess", "Popen") + b"((" + u("touch") + u(marker) + b"ltR.")
    case("stack_global.pt", "global 'os.system'",
         PROTO2 + u("os") + u("system") + b"\x93(" + u(f"touch {marker}") + b"tR.")
    case("build_setstate.pt", "BUILD (__setstate__) on 'torch._utils._rebuild_tensor_v2'",
         state_dict(("w", good + b"}" + u("__setstate__") + u("x") + b"sb")))
    case("newobj.pt", "NEWOBJ of 'torch.nn.parameter.Parameter'",
         state_dict(("w", glob("torch.nn.parameter", "Parameter") + b")\x81")))
    case("inst.pt", "opcode 0x69 is not supported",
         PROTO2 + b"(" + u(f"touch {marker}") + b"ios\nsystem\n.")
    case("module.pt", "global 'torch.nn.modules.linear.Linear'",
         PROTO2 + glob("torch.nn.modules.linear", "Linear") + b")\x81.")
    # bombs
    case("memo_bomb.pt", "memo index out of order",
         PROTO2 + b"]r\xff\xff\xff\x7f.")
    case("deep_nesting.pt", "stack deeper than the limit",
         PROTO2 + b"]" * (1 << 21) + b".")
    case("mark_bomb.pt", "more marks than the limit",
         PROTO2 + b"(" * (1 << 21) + b".")
    # 3^40 references through the memo: shared, never expanded
    laughs = b"]q\x000" + b"".join(b"(h" + bytes([i]) + b"h" + bytes([i]) + b"h" + bytes([i]) + b"lq" + bytes([i + 1]) + b"0"
                                    for i in range(40)) + b"h\x28"
    case("billion_laughs.pt", "entry 'w' is a list, not a tensor", state_dict(("w", laughs)))
    # storages against the archive
    case("storage_too_big.pt", "storage '0' is 64 bytes (torch.FloatStorage of 16) but its entry holds 16",
         state_dict(("w", tensor("0", 16, 0, [16], [1]))))
    case("storage_past_file.pt", "larger than the file",
         state_dict(("w", tensor("0", 1 << 30, 0, [4], [1]))))
    case("view_out_of_range.pt", "reaches element 5 of a storage of 4 elements",
         state_dict(("w", tensor("0", 4, 2, [4], [1]))))
    case("view_strided.pt", "is a strided view",
         state_dict(("w", tensor("0", 4, 0, [2], [2]))))
    case("overlapping_views.pt", "different views of overlapping bytes",
         state_dict(("a", tensor("0", 4, 0, [4], [1])), ("b", tensor("0", 4, 1, [2], [1]))))
    case("missing_storage.pt", "no entry 'archive/data/7'",
         state_dict(("w", tensor("7", 4, 0, [4], [1]))))
    case("complex128.pt", "torch.ComplexDoubleStorage has no safetensors dtype",
         state_dict(("w", tensor("0", 1, 0, [1], [1], "ComplexDoubleStorage"))))
    case("not_a_tensor.pt", "entry 'w' is a list, not a tensor",
         state_dict(("w", b"]")))
    case("compressed.pt", "is compressed", state_dict(("w", good)), compress=zipfile.ZIP_DEFLATED)
    # zips that lie
    ok = f"{d}/.ok.zip"
    torch_zip(ok, state_dict(("w", good)), {"0": b"\0" * 16})
    base = open(ok, "rb").read()
    entries = []
    pos = base.index(b"PK\x01\x02")
    while base[pos:pos + 4] == b"PK\x01\x02":
        nlen, xlen, clen = struct.unpack("<HHH", base[pos + 28:pos + 34])
        entries.append((pos, base[pos + 46:pos + 46 + nlen]))
        pos += 46 + nlen + xlen + clen
    by = dict((n, p) for p, n in entries)
    b = bytearray(base)
    pkl_local = struct.unpack("<I", b[by[b"archive/data.pkl"] + 42:by[b"archive/data.pkl"] + 46])[0]
    data_cd = by[b"archive/data/0"]
    b[data_cd + 42:data_cd + 46] = struct.pack("<I", pkl_local)
    case("zip_wrong_local.pt", "local header names another file", raw=bytes(b))
    b = bytearray(base)  # data.pkl grown (central and local agreeing) over the next entry
    pkl_cd = by[b"archive/data.pkl"]
    n = struct.unpack("<I", b[pkl_cd + 24:pkl_cd + 28])[0] + 40
    b[pkl_cd + 20:pkl_cd + 28] = struct.pack("<II", n, n)
    b[pkl_local + 18:pkl_local + 26] = struct.pack("<II", n, n)
    case("zip_overlap.pt", "entry 'archive/data.pkl' overlaps entry 'archive/data/0'", raw=bytes(b))
    b = bytearray(base)  # sizes: central says more than the local header
    b[data_cd + 20:data_cd + 28] = struct.pack("<II", 17, 17)
    case("zip_lying_size.pt", "local header says 16 bytes", raw=bytes(b))
    b = bytearray(base)  # an entry that runs past the data part of the file
    b[data_cd + 20:data_cd + 28] = struct.pack("<II", 1 << 20, 1 << 20)
    loc = struct.unpack("<I", b[data_cd + 42:data_cd + 46])[0]
    b[loc + 18:loc + 26] = struct.pack("<II", 1 << 20, 1 << 20)
    case("zip_escape.pt", "run past the data part of the archive", raw=bytes(b))
    b = bytearray(base)  # the central directory offset points outside the file
    eocd = base.rindex(b"PK\x05\x06")
    b[eocd + 16:eocd + 20] = struct.pack("<I", len(base) + 100)
    case("zip_cd_outside.pt", "runs past its end record", raw=bytes(b))
    case("truncated.pt", "no end-of-central-directory record", raw=base[: len(base) // 2])
    open(f"{d}/cases.txt", "w").write("\n".join(cases) + "\n")
    import os
    os.unlink(ok)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
