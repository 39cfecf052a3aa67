// hub_client.mjs — drives the npm package @huggingface/hub against a ckpt daemon
// and checks every byte against files given on the command line.
//   node hub_client.mjs HUB_URL REPO REVISION LOCAL_DIR [TOKEN]
// LOCAL_DIR holds what `ckpt pull` wrote for the same revision.
import { listFiles, downloadFile, parseSafetensorsMetadata } from "@huggingface/hub";
import { readFileSync, readdirSync, statSync } from "node:fs";
import { join, relative } from "node:path";

const [hubUrl, name, revision, localDir, accessToken] = process.argv.slice(2);
const repo = { type: "model", name };
const opts = { repo, revision, hubUrl, ...(accessToken ? { accessToken } : {}) };
const fail = (msg) => { console.error(`hub_client: ${msg}`); process.exit(1); };

function walk(dir) {
  return readdirSync(dir).flatMap((e) => {
    const p = join(dir, e);
    return statSync(p).isDirectory() ? walk(p) : [relative(localDir, p)];
  });
}

const local = walk(localDir).sort();
const listed = [];
for await (const f of listFiles({ ...opts, recursive: true })) if (f.type === "file") listed.push(f);
const names = listed.map((f) => f.path).sort();
if (JSON.stringify(names) !== JSON.stringify(local)) fail(`listFiles gave ${names} but the store has ${local}`);
for (const f of listed) {
  const want = readFileSync(join(localDir, f.path));
  if (f.size !== want.length) fail(`${f.path}: listed size ${f.size}, file has ${want.length}`);
  const blob = await downloadFile({ ...opts, path: f.path });
  if (!blob) fail(`${f.path}: downloadFile gave nothing`);
  const got = Buffer.from(await blob.arrayBuffer());
  if (!got.equals(want)) fail(`${f.path}: downloaded bytes differ`);
  if (want.length > 16) { // a byte slice: ranged reads
    const a = Math.floor(want.length / 3), b = Math.min(want.length, a + 12345);
    const part = Buffer.from(await blob.slice(a, b).arrayBuffer());
    if (!part.equals(want.subarray(a, b))) fail(`${f.path}: slice ${a}-${b} differs`);
  }
}
// Safetensors metadata, as the Hub's model pages read it (single file or sharded).
// (an original: its index or single file; a converted layout: a rank's file)
const st = local.find((p) => !p.includes("/") && p.endsWith(".safetensors.index.json"))
  ? "model.safetensors.index.json"
  : local.find((p) => !p.includes("/") && p.endsWith(".safetensors")) ?? local.find((p) => p.endsWith(".safetensors"));
if (st) {
  const meta = await parseSafetensorsMetadata({ ...opts, path: st.endsWith(".json") ? undefined : st });
  const headers = meta.sharded ? Object.values(meta.headers) : [meta.header];
  const count = headers.reduce((n, h) => n + Object.keys(h).filter((k) => k !== "__metadata__").length, 0);
  if (count === 0) fail("parseSafetensorsMetadata found no tensors");
  console.log(`hub_client: ${name}@${revision}: ${listed.length} files identical, ${count} tensors in metadata${meta.sharded ? " (sharded)" : ""}`);
} else {
  console.log(`hub_client: ${name}@${revision}: ${listed.length} files identical`);
}
