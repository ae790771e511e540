// xgrammar (npm @mlc-ai/web-xgrammar, C++ compiled to WASM) as a token-mask engine beside
// lib/grammar, for the mask bench and the mask comparison: the same requests, the same vocabulary.

import xgrammarSource from "@mlc-ai/web-xgrammar/lib/index.js" with { type: "text" };
import { createRequire } from "node:module";
import type { TokenConstraint } from "../lib/scheduler/sequence.ts";
import { BYTE_TO_CHAR } from "../lib/tokenizer/pre_tokenize.ts";
import type { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { type Engines, type MaskEngine, OurEngine } from "./grammar_engines.ts";
import type { GrammarSpec } from "./grammar_specs.ts";

/** The parts of the package's API used here (its own .d.ts types every handle as any). */
interface XgTokenizerInfo {
  getVocabSize(): number;
}
export interface XgCompiledGrammar {
  dispose(): void;
}
interface XgCompiler {
  compileJSONSchema(
    schema: string,
    anyWhitespace: boolean,
    indent: number,
    separators: [string, string],
    strictMode: boolean,
  ): Promise<XgCompiledGrammar>;
  compileGrammar(ebnf: string, rootRule?: string): Promise<XgCompiledGrammar>;
}
interface XgMatcher {
  getNextTokenBitmask(): Promise<Int32Array>;
  acceptToken(id: number): boolean;
  isTerminated(): boolean;
  dispose(): void;
}
interface XgModule {
  TokenizerInfo: {
    createTokenizerInfo(
      encodedVocab: string[],
      vocabType: string,
      prependSpace: boolean,
      vocabSize: number,
      stopTokenIds: number[],
    ): Promise<XgTokenizerInfo>;
  };
  GrammarCompiler: {
    createGrammarCompiler(info: XgTokenizerInfo, cacheEnabled: boolean): Promise<XgCompiler>;
  };
  GrammarMatcher: {
    createGrammarMatcher(
      compiled: XgCompiledGrammar,
      overrideStopTokens?: number[],
      terminateWithoutStopToken?: boolean,
    ): Promise<XgMatcher>;
  };
  Testings: {
    _jsonSchemaToEBNF(
      schema: string,
      anyWhitespace: boolean,
      indent: number,
      separators: [string, string],
      strictMode: boolean,
    ): Promise<string>;
  };
}

let loaded: XgModule | undefined;

/**
 * The package is a UMD bundle that its package.json calls an ES module, so neither import nor
 * require loads it: its text runs as CommonJS here (the WASM is inlined, so nothing else is read).
 */
function xgrammar(): XgModule {
  if (!loaded) {
    const module = { exports: {} };
    new Function("exports", "module", "require", "__filename", xgrammarSource)(
      module.exports,
      module,
      createRequire(import.meta.url),
      "/web-xgrammar/index.js",
    );
    loaded = module.exports as XgModule;
  }
  return loaded;
}

/** The separators lib/grammar writes JSON with (Python's json.dumps): one line, no other spaces. */
const SEPARATORS: [string, string] = [", ", ": "];

/** A grammar's rule names, prefixed so that several schemas' rules live in one grammar. */
function prefixRules(ebnf: string, prefix: string): string {
  const lines = ebnf.split("\n").filter((l) => l.includes(" ::= "));
  const names = new Set(lines.map((l) => l.slice(0, l.indexOf(" ::= "))));
  return lines.map((line) => {
    const at = line.indexOf(" ::= ");
    const body = line.slice(at + 5);
    let out = "";
    for (let i = 0; i < body.length;) {
      const c = body[i];
      if (c === '"' || c === "[") {
        // A string or a class: copied as it is, up to its unescaped closing character.
        const close = c === '"' ? '"' : "]";
        let j = i + 1;
        while (j < body.length && body[j] !== close) j += body[j] === "\\" ? 2 : 1;
        out += body.slice(i, j + 1);
        i = j + 1;
        continue;
      }
      const word = /^[A-Za-z_][A-Za-z0-9_]*/.exec(body.slice(i))?.[0];
      if (word) {
        out += names.has(word) ? prefix + word : word;
        i += word.length;
        continue;
      }
      out += c;
      i++;
    }
    return `${prefix}${line.slice(0, at)} ::= ${out}`;
  }).join("\n");
}

/** A literal in xgrammar's EBNF (its escapes are JSON's). */
const lit = (text: string) => JSON.stringify(text);

/** xgrammar over one tokenizer's vocabulary: its tokenizer info and compiler, built once. */
export class XgEngine implements MaskEngine<XgCompiledGrammar> {
  readonly name = "xgrammar";
  readonly #compiler: XgCompiler;
  /** Milliseconds the tokenizer info and compiler took to build. */
  readonly setupMs: number;

  private constructor(compiler: XgCompiler, setupMs: number) {
    this.#compiler = compiler;
    this.setupMs = setupMs;
  }

  /**
   * The engine of `tokenizer`: each token as its byte-level spelling (control tokens as "", which
   * xgrammar never allows, as lib/grammar does not), its end-of-generation ids as stop tokens.
   */
  static async of(tokenizer: TextTokenizer): Promise<XgEngine> {
    const start = performance.now();
    const xg = xgrammar();
    const vocab: string[] = [];
    for (let id = 0; id < tokenizer.vocabSize; id++) {
      let spelled = "";
      for (const b of tokenizer.tokenBytes(id, { specials: false })) spelled += BYTE_TO_CHAR[b];
      vocab.push(spelled);
    }
    const info = await xg.TokenizerInfo.createTokenizerInfo(
      vocab,
      "byte_level",
      false,
      tokenizer.vocabSize,
      [...tokenizer.eosIds],
    );
    const compiler = await xg.GrammarCompiler.createGrammarCompiler(info, true);
    return new XgEngine(compiler, performance.now() - start);
  }

  /** `spec` compiled against the vocabulary (xgrammar caches compiled grammars by their text). */
  async compile(spec: GrammarSpec): Promise<XgCompiledGrammar> {
    switch (spec.kind) {
      case "schema":
        return await this.#compiler.compileJSONSchema(
          JSON.stringify(spec.schema),
          false,
          -1,
          SEPARATORS,
          true,
        );
      case "gbnf":
        return await this.#compiler.compileGrammar(spec.grammar);
      case "tool": {
        // lib/server/tool_grammar.ts's call, each tool's arguments its schema's rules.
        const rules: string[] = [];
        const calls: string[] = [];
        for (const [i, tool] of spec.tools.entries()) {
          const ebnf = await xgrammar().Testings._jsonSchemaToEBNF(
            JSON.stringify(tool.inputSchema),
            false,
            -1,
            SEPARATORS,
            true,
          );
          rules.push(prefixRules(ebnf, `t${i}_`));
          calls.push(`${lit(`${JSON.stringify(tool.name)}, "arguments": `)} t${i}_root`);
        }
        const root = `root ::= ${lit('<tool_call>\n{"name": ')} (${calls.join(" | ")}) ${
          lit("}\n</tool_call>")
        }`;
        return await this.#compiler.compileGrammar([root, ...rules].join("\n"));
      }
    }
  }

  /** A constraint over a new matcher of `compiled`. */
  async constraint(compiled: XgCompiledGrammar): Promise<XgConstraint> {
    return new XgConstraint(await xgrammar().GrammarMatcher.createGrammarMatcher(compiled));
  }
}

/**
 * A matcher as a TokenConstraint. xgrammar has no token budget: its mask is the same whatever
 * `remaining` says (lib/grammar refuses tokens after which the text cannot end in time).
 */
export class XgConstraint implements TokenConstraint {
  readonly #matcher: XgMatcher;

  constructor(matcher: XgMatcher) {
    this.#matcher = matcher;
  }

  get done(): boolean {
    return this.#matcher.isTerminated();
  }

  async mask(_remaining: number): Promise<Uint32Array> {
    const mask = await this.#matcher.getNextTokenBitmask();
    return new Uint32Array(mask.buffer, mask.byteOffset, mask.length);
  }

  accept(id: number): void {
    if (!this.#matcher.acceptToken(id)) {
      throw new Error(`xgrammar refused token ${id}`);
    }
  }

  /** Frees the matcher's WASM memory; the constraint is unusable afterwards. */
  dispose(): void {
    this.#matcher.dispose();
  }
}

/**
 * lib/grammar and xgrammar over one vocabulary, ours first. Here rather than beside OurEngine, so
 * that timing the server's engine alone (`deno task bench --only grammar`) never loads the package.
 */
export async function buildEngines(tokenizer: TextTokenizer): Promise<Engines> {
  const start = performance.now();
  const ours = new OurEngine(tokenizer);
  const oursMs = performance.now() - start;
  const xg = await XgEngine.of(tokenizer);
  return { tokenizer, list: [ours, xg], setupMs: [oursMs, xg.setupMs], plain: ours.vocab.plain };
}
