"""payload_bytes.py DIR: the bytes a pull of DIR had to read from its blobs:
each safetensors file's tensor bytes (its size less the 8-byte length and
the header) plus the whole size of every other file. test_s3.sh compares a
rank pull's bytes received from the bucket with it; bench/s3.sh prints both."""
import os
import struct
import sys

total = 0
for root, _, files in os.walk(sys.argv[1]):
    for f in files:
        p = os.path.join(root, f)
        n = os.path.getsize(p)
        if f.endswith(".safetensors"):
            with open(p, "rb") as fh:
                n -= 8 + struct.unpack("<Q", fh.read(8))[0]
        total += n
print(total)
