// hub_client_api.mjs — the repository calls of the npm package @huggingface/hub
// against a ckpt daemon: modelInfo (revision HEAD), repoExists (/api/models/{repo}),
// listFiles with expand through paged answers, pathsInfo on a folder,
// listCommits / countCommits and fileExists.
//   node hub_client_api.mjs HUB_URL REPO COMMIT LAYOUT_COMMIT FILE_COUNT
// FILE_COUNT: how many files the layout neuron-tp2 has.
import {
  modelInfo, repoExists, listFiles, pathsInfo, listCommits, countCommits, fileExists,
} from "@huggingface/hub";

const [hubUrl, name, commit, layoutSha, fileCount] = process.argv.slice(2);
const repo = { type: "model", name };
const fail = (msg) => { console.error(`hub_client_api: ${msg}`); process.exit(1); };

const info = await modelInfo({ name, hubUrl, additionalFields: ["sha"] });
if (info.name !== name || info.sha !== commit) fail(`modelInfo: ${JSON.stringify(info)}`);
if (!(await repoExists({ repo, hubUrl }))) fail("repoExists says the repository is missing");
if (await repoExists({ repo: { type: "model", name: "Qwen/nope" }, hubUrl })) fail("repoExists says Qwen/nope exists");

// listFiles with expand, paged (the daemon runs with a small CKPT_HUB_PAGE_SIZE)
const entries = [];
for await (const e of listFiles({ repo, hubUrl, revision: "neuron-tp2", recursive: true, expand: true })) entries.push(e);
const files = entries.filter((e) => e.type === "file");
if (files.length !== Number(fileCount)) fail(`listFiles expand gave ${files.length} files, want ${fileCount}`);
for (const e of entries)
  if (!e.lastCommit || e.lastCommit.id !== layoutSha || isNaN(Date.parse(e.lastCommit.date)))
    fail(`listFiles expand: no lastCommit in ${JSON.stringify(e)}`);
const lfs = files.find((e) => e.lfs);
if (!lfs || lfs.lfs.size !== lfs.size || !/^[0-9a-f]{64}$/.test(lfs.lfs.oid)) fail("listFiles: no LFS entry");

const pi = await pathsInfo({ repo, hubUrl, revision: "neuron-tp2", paths: ["tp_rank_00"], expand: true });
if (pi.length !== 1 || pi[0].type !== "directory" || pi[0].lastCommit?.id !== layoutSha)
  fail(`pathsInfo on a folder: ${JSON.stringify(pi)}`);

const commits = [];
for await (const c of listCommits({ repo, hubUrl, revision: "neuron-tp2", batchSize: 1 })) commits.push(c.oid);
if (JSON.stringify(commits) !== JSON.stringify([layoutSha, commit])) fail(`listCommits: ${commits}`);
if ((await countCommits({ repo, hubUrl, revision: "neuron-tp2" })) !== 2) fail("countCommits");

if (!(await fileExists({ repo, hubUrl, path: "config.json", revision: layoutSha.slice(0, 12) })))
  fail("fileExists by a prefix of the layout's commit");
if (await fileExists({ repo, hubUrl, path: "nope.json" })) fail("fileExists on a missing file");
console.log(`hub_client_api: modelInfo, repoExists, listFiles expand (paged), pathsInfo, listCommits, fileExists: ok`);
