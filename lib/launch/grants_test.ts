// lib/launch/grants.ts: the role thread's grant follows the flags: listen address and next hop,
// every file of the model and the key files, Dawn's folder only when the GPU backend may load it.

import assert from "node:assert/strict";
import { codeFolders, dawnFolder, roleGrant } from "./grants.ts";

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
  const grant = roleGrant(WORKER, "/dawn/linux-x64");
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
  const grant = roleGrant(head, "/dawn/linux-x64");
  assert.deepEqual(grant.net, ["[::1]:8080"]);
  assert.deepEqual(grant.read, ["shards/q.layers-0-20.gguf", "api-key"]);
  assert.equal(grant.ffi, false);
  assert.equal(roleGrant({ ...WORKER, backend: "reference" }, "/dawn/linux-x64").ffi, false);
  assert.equal(roleGrant(WORKER, undefined).ffi, false);
  // The head's guarded HTTP server and its tokenizer thread's modules.
  const full = roleGrant({ ...head, internal: 40001, threads: true }, undefined);
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
