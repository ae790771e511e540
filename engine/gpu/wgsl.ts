// WGSL sources in wgsl/ and the tiny preprocessor that turns one file into one kernel variant.
// Used by engine/gpu/kernel.ts when it builds a pipeline; engine/gpu/wgsl_contract_test.ts reads the
// same expanded text.
//
// Directives (line-based, nothing else): `#include "file"` (from wgsl/), `#ifdef NAME`,
// `#ifndef NAME`, `#else`, `#endif`. A define with a number becomes `const NAME = value;`; `true`
// only enables `#ifdef NAME`. `enable` lines are hoisted above the constants, as WGSL requires.

import { WGSL_SOURCES } from "./wgsl_sources.ts";

/** A variant's defines: numbers become WGSL constants, `true` marks a flag for `#ifdef`. */
export type Defines = Readonly<Record<string, number | true>>;

/** The text of wgsl/<name>. */
export function wgslSource(name: string): string {
  const text = WGSL_SOURCES.get(name);
  if (text === undefined) {
    throw new Error(
      `Cannot find WGSL source "${name}": engine/gpu/wgsl_sources.ts does not import it; add ` +
        `wgsl/${name} there`,
    );
  }
  return text;
}

function expand(name: string, defines: Defines, depth: number): string[] {
  if (depth > 8) throw new Error(`Cannot expand WGSL "${name}": #include nested deeper than 8`);
  const out: string[] = [];
  // One entry per open #ifdef: whether its current branch is taken.
  const stack: { on: boolean }[] = [];
  const emitting = () => stack.every((s) => s.on);
  const lines = wgslSource(name).split("\n");
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const trimmed = line.trim();
    if (!trimmed.startsWith("#")) {
      if (emitting()) out.push(line);
      continue;
    }
    const [directive, arg = ""] = trimmed.split(/\s+/, 2);
    const where = `${name}:${i + 1}`;
    if (directive === "#ifdef" || directive === "#ifndef") {
      const set = Object.hasOwn(defines, arg);
      stack.push({ on: directive === "#ifdef" ? set : !set });
    } else if (directive === "#else") {
      const top = stack.at(-1);
      if (!top) throw new SyntaxError(`Cannot expand WGSL at ${where}: #else without #ifdef`);
      top.on = !top.on;
    } else if (directive === "#endif") {
      if (!stack.pop()) {
        throw new SyntaxError(`Cannot expand WGSL at ${where}: #endif without #ifdef`);
      }
    } else if (directive === "#include") {
      if (emitting()) out.push(...expand(arg.replace(/^"|"$/g, ""), defines, depth + 1));
    } else {
      throw new SyntaxError(`Cannot expand WGSL at ${where}: unknown directive "${directive}"`);
    }
  }
  if (stack.length) throw new SyntaxError(`Cannot expand WGSL "${name}": missing #endif`);
  return out;
}

/** The WGSL of one variant of wgsl/<name>: includes and conditionals resolved, defines declared. */
export function expandWgsl(name: string, defines: Defines): string {
  const body = expand(name, defines, 0);
  const enables = body.filter((l) => /^\s*enable\s/.test(l));
  const rest = body.filter((l) => !/^\s*enable\s/.test(l));
  const consts = Object.entries(defines)
    .filter(([, v]) => typeof v === "number")
    .map(([k, v]) => `const ${k} = ${Number.isInteger(v) ? v : `${v}f`};`);
  return [...enables, ...consts, ...rest].join("\n");
}
