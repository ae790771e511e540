// Every file in deploy/ parses (YAML, plist XML, systemd units, the Containerfile, the shell
// script), and every argument list it passes goes through the CLI's own flag parser; the split
// pieces keep the sizing contract between them (docs/DEPLOY.md).

import assert from "node:assert/strict";
import { parseAllDocuments } from "yaml";
import { parse as parsePlist } from "plist";
import { stageShardPath } from "../engine/gguf/stage_shard.ts";
import { type Command, type FlagTable, readFlags } from "../lib/cli.ts";
import { HEAD } from "../main.ts";
import { COMPILE } from "../tools/compile.ts";
import { WORKER } from "../worker.ts";

const DEPLOY = new URL("../deploy/", import.meta.url);
const read = (name: string) => Deno.readTextFileSync(new URL(name, DEPLOY));

/** The role a binary path runs, by its file name. */
const ROLES: Readonly<Record<string, Command<FlagTable>>> = {
  "tandem-head": HEAD,
  "tandem-worker": WORKER,
};

interface Stage {
  readonly binary: string;
  readonly flags: Record<string, unknown>;
}

/** An argument list after the binary, parsed as that binary's CLI parses it. */
function parseRole(binary: string, args: readonly string[], where: string): Stage {
  const name = binary.slice(binary.lastIndexOf("/") + 1);
  const command = ROLES[name];
  assert.ok(command, `${where}: ${binary} is not a tandem binary`);
  const flags = readFlags(command, args, () => undefined);
  assert.ok(flags, `${where}: the arguments ask for --help`);
  return { binary: name, flags: flags as Record<string, unknown> };
}

type Layers = { first: number; end: number };

/** The sizing contract between a head and the worker behind it, and their shards' names. */
function assertChain(head: Stage, worker: Stage, where: string): void {
  const h = head.flags, w = worker.flags;
  const [hl, wl] = [h.layers as Layers, w.layers as Layers];
  assert.equal(hl.first, 0, `${where}: the head starts at layer 0`);
  assert.equal(wl.first, hl.end, `${where}: the worker starts where the head ends`);
  for (const k of ["slots", "ctx", "snapshots"]) {
    assert.ok(
      (w[k] as number) >= (h[k] as number),
      `${where}: the worker's --${k} covers the head's`,
    );
  }
  assert.equal(
    Boolean(h["key-file"]),
    Boolean(w["key-file"]),
    `${where}: both or neither use a key`,
  );
  for (const [s, layers] of [[h, hl], [w, wl]] as const) {
    const model = s.model as string;
    const dir = model.slice(0, model.lastIndexOf("/"));
    assert.equal(model, stageShardPath(dir, model, layers), `${where}: ${model} is a shard name`);
  }
}

interface K8sObject {
  kind: string;
  metadata: { name: string; labels?: Record<string, string> };
  // deno-lint-ignore no-explicit-any -- manifests are checked field by field below
  spec: any;
}

function manifests(): Map<string, K8sObject[]> {
  const files = new Map<string, K8sObject[]>();
  for (const e of Deno.readDirSync(new URL("k8s/", DEPLOY))) {
    const docs = parseAllDocuments(read(`k8s/${e.name}`));
    for (const d of docs) assert.deepEqual(d.errors, [], `k8s/${e.name}`);
    files.set(e.name, docs.map((d) => d.toJS() as K8sObject));
  }
  return files;
}

Deno.test("Kubernetes: heads and worker parse, start at 0 replicas, probe /health, pass valid flags", () => {
  const files = manifests();
  const all = [...files.values()].flat();
  const deployments = all.filter((o) => o.kind === "Deployment");
  assert.deepEqual(deployments.map((d) => d.metadata.name).sort(), [
    "tandem-head-split",
    "tandem-head-unsplit",
    "tandem-worker",
  ]);
  const stages = new Map<string, Stage>();
  for (const d of deployments) {
    const name = d.metadata.name;
    assert.equal(d.spec.replicas, 0, `${name}: switch.sh owns scaling`);
    const pod = d.spec.template;
    for (const [k, v] of Object.entries(d.spec.selector.matchLabels)) {
      assert.equal(pod.metadata.labels[k], v, `${name}: the selector matches its pods`);
    }
    const [c] = pod.spec.containers;
    const stage = parseRole(c.command[0], c.args, name);
    stages.set(name, stage);
    assert.ok(c.resources.requests.memory && c.resources.limits["nvidia.com/gpu"], name);
    const mounts = new Map(c.volumeMounts.map((m: { name: string }) => [m.name, m]));
    assert.ok((stage.flags.model as string).startsWith("/models/"), name);
    assert.equal((mounts.get("models") as { readOnly: boolean }).readOnly, true, name);
    const port = c.ports[0];
    assert.equal(port.containerPort, stage.flags.port, `${name}: the port it listens on`);
    assert.equal(stage.flags.host, "0.0.0.0", `${name}: reachable from its Service`);
    if (stage.binary === "tandem-head") {
      assert.equal(c.readinessProbe.httpGet.path, "/health", name);
      assert.equal(c.livenessProbe.httpGet.path, "/health?scope=head", name);
      assert.equal(c.startupProbe.httpGet.path, "/health?scope=head", name);
      assert.equal(pod.metadata.labels["tandem.dev/serves-api"], "true", name);
    } else {
      assert.ok(pod.spec.nodeSelector["nvidia.com/gpu.present"], `${name}: a GPU node`);
    }
    // Each Deployment has a Service in its file selecting its pods by port name.
    const file = [...files.entries()].find(([, objs]) => objs.includes(d))![1];
    const service = file.find((o) => o.kind === "Service")!;
    assert.equal(service.spec.selector["app.kubernetes.io/name"], name);
    assert.equal(service.spec.ports[0].targetPort, port.name, name);
  }
  const split = stages.get("tandem-head-split")!;
  const worker = stages.get("tandem-worker")!;
  const workerService = all.find((o) =>
    o.kind === "Service" && o.metadata.name === "tandem-worker"
  )!;
  assert.equal(split.flags.next, `tandem-worker:${workerService.spec.ports[0].port}`);
  assertChain(split, worker, "k8s split");
  assert.equal(stages.get("tandem-head-unsplit")!.flags.layers, undefined);
  const client = files.get("tandem-service.yaml")!;
  assert.deepEqual(client.map((o) => o.kind), ["Service"]);
  assert.deepEqual(client[0].spec.selector, { "tandem.dev/serves-api": "true" });
});

/** A systemd unit as sections of (key, value) pairs; continuation lines joined. */
function parseUnit(text: string, where: string): Map<string, [string, string][]> {
  const sections = new Map<string, [string, string][]>();
  let current: [string, string][] | undefined;
  const lines = text.replace(/\\\n/g, " ").split("\n");
  for (const [i, raw] of lines.entries()) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#") || line.startsWith(";")) continue;
    const section = /^\[([A-Za-z]+)\]$/.exec(line);
    if (section) {
      current = [];
      sections.set(section[1], current);
      continue;
    }
    const kv = /^([A-Za-z]+)=(.*)$/.exec(line);
    assert.ok(kv && current, `${where}:${i + 1}: not "Key=value" inside a section: ${line}`);
    current.push([kv[1], kv[2]]);
  }
  return sections;
}

Deno.test("systemd: both units parse, restart, and pass valid flags with their credentials", () => {
  const stages: Stage[] = [];
  for (const name of ["tandem-head.service", "tandem-worker.service"]) {
    const unit = parseUnit(read(`systemd/${name}`), name);
    assert.deepEqual([...unit.keys()], ["Unit", "Service", "Install"], name);
    const service = new Map(unit.get("Service"));
    assert.equal(service.get("Restart"), "always", name);
    assert.equal(unit.get("Install")!.find(([k]) => k === "WantedBy")?.[1], "multi-user.target");
    const [binary, ...args] = service.get("ExecStart")!.split(/\s+/);
    const stage = parseRole(binary, args, name);
    assert.equal(stage.binary, name.replace(".service", ""));
    stages.push(stage);
    // Each %d/<name> is a credential the unit loads.
    const loaded = unit.get("Service")!.filter(([k]) => k === "LoadCredential")
      .map(([, v]) => v.split(":")[0]);
    const used = args.filter((a) => a.startsWith("%d/")).map((a) => a.slice(3));
    assert.deepEqual(used.sort(), loaded.sort(), name);
  }
  const [head, worker] = stages;
  assert.equal((head.flags.next as string).split(":")[1], String(worker.flags.port));
  assertChain(head, worker, "systemd");
});

Deno.test("launchd: the macOS worker plist parses, keeps alive, passes port, layers, ctx, slots, key", () => {
  const job = parsePlist(read("launchd/dev.tandem.worker.plist")) as Record<string, unknown>;
  assert.equal(job.Label, "dev.tandem.worker");
  assert.equal(job.KeepAlive, true);
  assert.equal(job.RunAtLoad, true);
  const argv = job.ProgramArguments as string[];
  const at = argv.findIndex((a) => a.endsWith("/tandem-worker"));
  assert.deepEqual(argv.slice(0, at), ["/usr/bin/caffeinate", "-i"]);
  const worker = parseRole(argv[at], argv.slice(at + 1), "launchd");
  for (const flag of ["port", "layers", "ctx", "slots", "key-file"]) {
    assert.ok(argv.includes(`--${flag}`), `launchd: --${flag} is given`);
  }
  // It can stand in for the systemd worker behind the same head.
  const unit = parseUnit(read("systemd/tandem-head.service"), "tandem-head.service");
  const [binary, ...args] = new Map(unit.get("Service")).get("ExecStart")!.split(/\s+/);
  assertChain(parseRole(binary, args, "systemd head"), worker, "launchd");
});

Deno.test("Containerfile: builds the binaries with deno task compile and installs both", () => {
  const text = read("Containerfile").replace(/\\\n/g, " ");
  const instructions = text.split("\n").map((l) => l.trim())
    .filter((l) => l !== "" && !l.startsWith("#"));
  for (const i of instructions) {
    assert.match(i, /^(FROM|ARG|WORKDIR|COPY|RUN|USER|EXPOSE|ENTRYPOINT) /, i);
  }
  assert.ok(instructions[0].startsWith(`FROM denoland/deno:${Deno.version.deno} `));
  const compile = /deno task compile ((?:--\S+ \S+ ?)+)/.exec(text);
  assert.ok(compile, "the build stage runs deno task compile");
  const args = compile[1].trim().split(" ").map((a) => a.replace(/\$\(.*$/, "x64"));
  assert.ok(readFlags(COMPILE, args, () => undefined));
  const entry = instructions.find((i) => i.startsWith("ENTRYPOINT"))!;
  assert.deepEqual(JSON.parse(entry.slice("ENTRYPOINT ".length)), ["/usr/local/bin/tandem-head"]);
  assert.ok(
    /COPY --from=build \/out\/tandem-head \/out\/tandem-worker \/usr\/local\/bin\//.test(text),
  );
});

Deno.test("switch.sh scales the other backends to 0 and waits for their pods before scaling up", async () => {
  const dir = await Deno.makeTempDir({ prefix: "tandem-switch-" });
  try {
    const log = `${dir}/calls`;
    await Deno.writeTextFile(
      `${dir}/kubectl`,
      `#!/bin/sh\necho "$*" >> ${log}\n`,
      { mode: 0o755 },
    );
    const run = (mode: string) =>
      new Deno.Command("sh", {
        args: [decodeURIComponent(new URL("switch.sh", DEPLOY).pathname), mode],
        env: { KUBECTL: `${dir}/kubectl`, NAMESPACE: "llm" },
        stdout: "null",
        stderr: "piped",
      }).output();
    const split = await run("split");
    assert.equal(split.code, 0, new TextDecoder().decode(split.stderr));
    assert.deepEqual((await Deno.readTextFile(log)).trim().split("\n"), [
      "--namespace llm scale deployment/tandem-head-unsplit --replicas=0",
      "--namespace llm get pods -l app.kubernetes.io/name=tandem-head-unsplit -o name",
      "--namespace llm scale deployment/tandem-worker --replicas=1",
      "--namespace llm scale deployment/tandem-head-split --replicas=1",
      "--namespace llm rollout status deployment/tandem-worker --timeout=900s",
      "--namespace llm rollout status deployment/tandem-head-split --timeout=900s",
    ]);
    await Deno.remove(log);
    assert.equal((await run("unsplit")).code, 0);
    const calls = (await Deno.readTextFile(log)).trim().split("\n");
    assert.deepEqual(calls.filter((c) => c.includes("scale")), [
      "--namespace llm scale deployment/tandem-head-split --replicas=0",
      "--namespace llm scale deployment/tandem-worker --replicas=0",
      "--namespace llm scale deployment/tandem-head-unsplit --replicas=1",
    ]);
    const bad = await run("sideways");
    assert.equal(bad.code, 2);
    assert.match(
      new TextDecoder().decode(bad.stderr),
      /Usage: .* unsplit\|split\|split-remote\|off/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
