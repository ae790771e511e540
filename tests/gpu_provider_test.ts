// GPU providers and device opening (engine/gpu/{provider,device,builtin}.ts): software-adapter
// detection and refusal, provider choice, the start-up log line, and both kept off EGL on Linux.

import assert from "node:assert/strict";
import { openGpu } from "../engine/gpu/device.ts";
import { builtinProvider } from "../engine/gpu/builtin.ts";
import { dawnProvider } from "../engine/gpu/dawn.ts";
import { isSoftwareAdapter, type ProviderChoice, selectProvider } from "../engine/gpu/provider.ts";
import { ignore } from "./_gpu.ts";

function info(description: string, isFallbackAdapter = false): GPUAdapterInfo {
  return {
    vendor: "",
    architecture: "",
    device: "",
    description,
    isFallbackAdapter,
  } as unknown as GPUAdapterInfo;
}

Deno.test("isSoftwareAdapter() flags CPU rasterisers and fallback adapters only", () => {
  assert.ok(isSoftwareAdapter(info("llvmpipe (LLVM 15.0.6, 256 bits)")));
  assert.ok(isSoftwareAdapter(info("SwiftShader Device (Subzero)")));
  assert.ok(isSoftwareAdapter(info("Lavapipe")));
  assert.ok(isSoftwareAdapter(info("Some GPU", true)));
  assert.ok(!isSoftwareAdapter(info("NVIDIA H200")));
  assert.ok(!isSoftwareAdapter(info("AMD Radeon RX 7900 XTX (RADV NAVI31)")));
});

Deno.test("selectProvider() rejects an unknown choice", async () => {
  await assert.rejects(() => selectProvider("cuda" as ProviderChoice), /expected one of auto/);
});

/** Runs `body` with TANDEM_ALLOW_SOFTWARE_GPU unset, restoring it afterwards. */
async function withoutEnvAllowance(body: () => Promise<void>): Promise<void> {
  const saved = Deno.env.get("TANDEM_ALLOW_SOFTWARE_GPU");
  Deno.env.delete("TANDEM_ALLOW_SOFTWARE_GPU");
  try {
    await body();
  } finally {
    if (saved !== undefined) Deno.env.set("TANDEM_ALLOW_SOFTWARE_GPU", saved);
  }
}

Deno.test({
  name: "openGpu() refuses a software adapter unless allowed, and logs what it opened",
  ignore,
  fn: () =>
    withoutEnvAllowance(async () => {
      const lines: string[] = [];
      const log = (l: string) => lines.push(l);
      const adapter = await builtinProvider().gpu.requestAdapter({
        powerPreference: "high-performance",
      });
      if (adapter && isSoftwareAdapter(adapter.info)) {
        await assert.rejects(
          () => openGpu({ gpu: "builtin", log }),
          /software \(CPU\) adapter; pass --allow-software-gpu or set TANDEM_ALLOW_SOFTWARE_GPU=1/,
        );
        Deno.env.set("TANDEM_ALLOW_SOFTWARE_GPU", "1");
      }
      const gpu = await openGpu({ gpu: "builtin", log });
      assert.equal(gpu.provider, "builtin");
      assert.equal(gpu.software, isSoftwareAdapter(gpu.info));
      assert.equal(lines.length, 1);
      assert.match(lines[0], /^GPU: builtin provider, adapter "/);
      assert.ok(gpu.limits.maxStorageBufferBindingSize >= 128 * 2 ** 20);
      gpu.device.destroy();
    }),
});

Deno.test({
  name: "selectProvider('auto') takes Dawn only when it has a hardware adapter",
  ignore,
  fn: async () => {
    let dawnHardware = false;
    try {
      const adapter = await (await dawnProvider()).gpu.requestAdapter();
      dawnHardware = adapter !== null && !isSoftwareAdapter(adapter.info);
    } catch {
      dawnHardware = false;
    }
    const chosen = await selectProvider("auto");
    assert.equal(chosen.name, dawnHardware ? "dawn" : "builtin");
  },
});

Deno.test({
  name: "the GPU providers keep off EGL on Linux: wgpu asks Vulkan only, Dawn never loads libEGL",
  ignore: ignore || Deno.build.os !== "linux",
  fn: async () => {
    // A fresh process without DENO_WEBGPU_BACKEND: the builtin provider sets it before wgpu reads
    // it. Dawn (TANDEM_GPU=dawn, --gpu dawn) shares the process in the same way at exit, so its
    // adapter search must not load libEGL either (it asks no GL backend unless told to).
    const code = `
      const egl = async () => (await Deno.readTextFile("/proc/self/maps")).includes("libEGL");
      const { builtinProvider } = await import(${
      JSON.stringify(import.meta.resolve("../engine/gpu/builtin.ts"))
    });
      const { dawnProvider } = await import(${
      JSON.stringify(import.meta.resolve("../engine/gpu/dawn.ts"))
    });
      const adapter = await builtinProvider().gpu.requestAdapter();
      const builtinEgl = await egl();
      const mesa = /llvmpipe|lavapipe|mesa/i.test(
        [adapter?.info.description, adapter?.info.device, adapter?.info.architecture].join(" "),
      );
      await (await dawnProvider()).gpu.requestAdapter();
      console.log(JSON.stringify({
        adapter: adapter !== null,
        mesa,
        backend: Deno.env.get("DENO_WEBGPU_BACKEND"),
        builtinEgl,
        dawnEgl: await egl(),
      }));`;
    const env = { ...Deno.env.toObject() };
    delete env.DENO_WEBGPU_BACKEND;
    delete env.TANDEM_DAWN_OPTIONS;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", code],
      env,
      clearEnv: true,
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, stderr);
    const seen = JSON.parse(new TextDecoder().decode(out.stdout));
    assert.equal(seen.adapter, true);
    assert.equal(seen.backend, "vulkan");
    // The abort was libglvnd's EGL torn down beside Mesa at exit. A vendor Vulkan driver may load
    // libEGL itself (NVIDIA's does on the H200 box), which no provider setting can avoid.
    if (seen.mesa) assert.deepEqual([seen.builtinEgl, seen.dawnEgl], [false, false]);
  },
});
