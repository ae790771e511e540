// lib/launch/grants.ts: the role thread's grant follows the flags: listen address and next hop,
// every file of the model and the key files as their links resolve, Dawn's folder only when the
// GPU backend may load it.

import assert from "node:assert/strict";
import {
  codeFolders,
  dawnFolder,
  describeGrant,
  resolveRoleFiles,
  type RoleFlags,
  roleGrant,
} from "./grants.ts";

/** The grant of `flags`, their files resolved as the launcher resolves them. */
const grantOf = (flags: RoleFlags, dawn: string | undefined) =>
  roleGrant(flags, resolveRoleFiles(flags), dawn);

const WORKER = {
  model: "/m/qwen-00001-of-00003.gguf",
  host: "0.0.0.0",
  port: 9001,
  next: "10.0.0.3:9002",
  "key-file": "/etc/tandem/wire-key",
  backend: "gpu",
  gpu: "auto",
};

Deno.test("a worker may reach its address and next hop, and read its model files and key", () => {
  // None of these exists here: a missing file is granted as given, and fails when opened.
  const grant = grantOf(WORKER, "/dawn/linux-x64");
  assert.deepEqual(grant, {
    net: ["0.0.0.0:9001", "10.0.0.3:9002"],
    read: [
      "/m/qwen-00001-of-00003.gguf",
      "/m/qwen-00002-of-00003.gguf",
      "/m/qwen-00003-of-00003.gguf",
      "/etc/tandem/wire-key",
    ],
    env: ["TANDEM_*"],
    ffi: ["/dawn/linux-x64"],
    write: false,
    run: false,
    sys: false,
    import: false,
  });
});

Deno.test("a head on IPv6 with an API key; no FFI unless the GPU backend may load Dawn", () => {
  const head = {
    model: "shards/q.layers-0-20.gguf",
    host: "::1",
    port: 8080,
    "api-key-file": "api-key",
    backend: "gpu",
    gpu: "builtin",
  };
  const grant = grantOf(head, "/dawn/linux-x64");
  assert.deepEqual(grant.net, ["[::1]:8080"]);
  assert.deepEqual(grant.read, ["shards/q.layers-0-20.gguf", "api-key"]);
  assert.equal(grant.ffi, false);
  assert.equal(grantOf({ ...WORKER, backend: "reference" }, "/dawn/linux-x64").ffi, false);
  assert.equal(grantOf(WORKER, undefined).ffi, false);
  // The head's guarded HTTP server and its tokenizer thread's modules.
  const full = grantOf({ ...head, internal: 40001, threads: true }, undefined);
  assert.deepEqual(full.net, ["[::1]:8080", "127.0.0.1:40001"]);
  assert.deepEqual(full.read, ["shards/q.layers-0-20.gguf", "api-key", ...codeFolders()]);
  assert.ok(codeFolders().some((f) => f.endsWith("/lib/")));
});

Deno.test("Dawn's folder is this platform's, inside the installed webgpu package", () => {
  const folder = dawnFolder();
  assert.ok(folder, "the webgpu package ships a Dawn for this platform");
  assert.match(folder, /\/webgpu\/dist\/(linux|darwin|win32)-(x64|arm64|universal)\/$/);
  assert.ok(Deno.statSync(`${folder}dawn.node`).isFile);
});

/** Runs `use` in a fresh directory, as its working directory, and removes it. */
async function inTempDir(use: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.realPath(await Deno.makeTempDir({ prefix: "tandem-links-" }));
  const cwd = Deno.cwd();
  Deno.chdir(dir);
  try {
    await use(dir);
  } finally {
    Deno.chdir(cwd);
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("a split model in the Hugging Face cache is granted as its blobs, each shard resolved from its own link", () =>
  inTempDir(async (dir) => {
    const repo = "hub/models--org--name";
    await Deno.mkdir(`${repo}/blobs`, { recursive: true });
    await Deno.mkdir(`${repo}/snapshots/rev`, { recursive: true });
    for (let i = 1; i <= 3; i++) {
      // The blobs' names say nothing of the shard each holds; only the links do.
      await Deno.writeTextFile(`${repo}/blobs/sha${4 - i}`, "");
      await Deno.symlink(
        `../../blobs/sha${4 - i}`,
        `${repo}/snapshots/rev/m-0000${i}-of-00003.gguf`,
      );
    }
    // A relative link to a key in a linked folder.
    await Deno.mkdir("secrets");
    await Deno.writeTextFile("secrets/wire", "k");
    await Deno.symlink("secrets", "etc");
    await Deno.symlink("etc/wire", "wire-key");
    const flags = {
      ...WORKER,
      model: `${repo}/snapshots/rev/m-00001-of-00003.gguf`,
      "key-file": "wire-key",
    };
    const files = resolveRoleFiles(flags);
    assert.deepEqual(files.model.path, flags.model);
    assert.deepEqual(
      files.model.files.map((f) => f.given),
      [1, 2, 3].map((i) => `${repo}/snapshots/rev/m-0000${i}-of-00003.gguf`),
    );
    const blobs = [3, 2, 1].map((n) => `${dir}/${repo}/blobs/sha${n}`);
    assert.deepEqual(files.model.files.map((f) => f.resolved), blobs);
    assert.deepEqual(files["key-file"], { given: "wire-key", resolved: `${dir}/secrets/wire` });
    const grant = roleGrant(flags, files, undefined);
    // The resolved files and nothing more: no link, no folder.
    assert.deepEqual(grant.read, [...blobs, `${dir}/secrets/wire`]);
    const line = describeGrant(grant, files);
    assert.ok(line.includes(`read ${flags.model} -> ${blobs[0]}, `), line);
    assert.ok(line.includes(`, wire-key -> ${dir}/secrets/wire; env`), line);
  }));

Deno.test("a link that leads nowhere it can end is refused by name before the role starts", () =>
  inTempDir(async () => {
    await Deno.symlink("loop-b", "loop-a");
    await Deno.symlink("loop-a", "loop-b");
    assert.throws(
      () => resolveRoleFiles({ ...WORKER, model: "m.gguf", "key-file": "loop-a" }),
      /^Error: Cannot follow "loop-a" to its file: .*; fix the link or give the file's own path/,
    );
    // A dangling link is granted as given: opening it is what fails, with its own message.
    await Deno.symlink("gone.gguf", "dangling.gguf");
    const files = resolveRoleFiles({ ...WORKER, model: "dangling.gguf" });
    assert.deepEqual(files.model.files, [{ given: "dangling.gguf", resolved: "dangling.gguf" }]);
  }));
