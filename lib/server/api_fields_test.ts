// Tests for the request-field tables: docs/API_FIELDS.md lists exactly the fields, handling and
// notes of lib/server/api_fields.ts, and checkFields refuses unknown and refused fields by name.

import assert from "node:assert/strict";
import { ApiError } from "./api_error.ts";
import { checkFields, fieldsOf, ROUTE_FIELDS } from "./api_fields.ts";
import { Field, type JsonObject } from "./fields.ts";

/** Each `## heading` of the doc → the cells of its table's body rows. */
function docTables(text: string): Map<string, string[][]> {
  const tables = new Map<string, string[][]>();
  let rows: string[][] | undefined;
  for (const line of text.split("\n")) {
    if (line.startsWith("## ")) {
      rows = [];
      tables.set(line.slice(3).trim(), rows);
    } else if (rows && line.startsWith("|") && !/^\|\s*-/.test(line)) {
      rows.push(line.slice(1, -1).split("|").map((cell) => cell.trim()));
    }
  }
  for (const rows of tables.values()) rows.shift(); // the header row
  return tables;
}

Deno.test("docs/API_FIELDS.md has one table per route, equal to the code's field list", async () => {
  const doc = await Deno.readTextFile(new URL("../../docs/API_FIELDS.md", import.meta.url));
  const tables = docTables(doc);
  for (const { route, fields } of ROUTE_FIELDS) {
    for (const [name, r] of Object.entries(fields)) {
      assert.ok(!r.note.includes("|"), `${route} ${name}: a note with "|" breaks the table`);
    }
    const expected = Object.entries(fields).map(([name, r]) => [`\`${name}\``, r.handling, r.note]);
    const render = expected.map((row) => `| ${row.join(" | ")} |`).join("\n");
    assert.deepEqual(
      tables.get(route),
      expected,
      `docs/API_FIELDS.md's "## ${route}" table must hold these rows (then run deno fmt):\n${render}`,
    );
  }
  const routes = new Set(ROUTE_FIELDS.map((r) => r.route));
  const extra = [...tables.keys()].filter((h) => h.startsWith("POST ") && !routes.has(h));
  assert.deepEqual(extra, [], "the doc lists routes that have no field table");
});

function refusal(body: JsonObject, route: string): ApiError {
  try {
    checkFields(Field.root(body), fieldsOf(route));
  } catch (e) {
    assert.ok(e instanceof ApiError);
    assert.equal(e.kind, "invalid_request");
    return e;
  }
  assert.fail(`${JSON.stringify(body)} was accepted`);
}

Deno.test("an unknown field is refused by its path, at the top and inside a listed object", () => {
  const top = refusal({ model: "m", frobnicate: 1 }, "POST /v1/messages");
  assert.equal(top.param, "frobnicate");
  assert.match(top.message, /^frobnicate: unknown field/);
  const nested = refusal({ thinking: { type: "enabled", depth: 3 } }, "POST /v1/messages");
  assert.equal(nested.param, "thinking.depth");
});

Deno.test("a refused field is refused by name unless it holds its neutral value or null", () => {
  const route = "POST /completion";
  const e = refusal({ prompt: "x", mirostat: 2 }, route);
  assert.equal(e.param, "mirostat");
  assert.match(e.message, /^mirostat: not supported by this server: no mirostat$/);
  const neutral: JsonObject[] = [{ mirostat: 0 }, { mirostat: null }, { typical_p: 1 }, {
    lora: [],
  }];
  for (const body of neutral) {
    checkFields(Field.root({ prompt: "x", ...body }), fieldsOf(route));
  }
  assert.equal(refusal({ lora: [{ id: 0, scale: 1 }] }, route).param, "lora");
  const chat = "POST /v1/chat/completions";
  checkFields(Field.root({ modalities: ["text"] }), fieldsOf(chat));
  assert.equal(refusal({ modalities: ["text", "audio"] }, chat).param, "modalities");
});

Deno.test("ignored fields, and keys inside objects the table does not open, are accepted", () => {
  checkFields(
    Field.root({
      metadata: { user_id: "u" },
      context_management: { edits: [{ type: "clear_tool_uses_20250919" }] },
      cache_control: { type: "ephemeral" },
      thinking: { type: "enabled", budget_tokens: 2048 },
    }),
    fieldsOf("POST /v1/messages"),
  );
});

Deno.test("count_tokens accepts the create-only fields its clients copy over", () => {
  checkFields(
    Field.root({ model: "m", messages: [], max_tokens: 5, stream: true, temperature: 0.5 }),
    fieldsOf("POST /v1/messages/count_tokens"),
  );
});
