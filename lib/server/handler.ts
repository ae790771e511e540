// handle(Request) → Response for the head: routes, API keys, body limits, and containment (every
// failure becomes an error response in the route's API shape). lib/server/head.ts serves it with Deno.serve.

import { ApiError, errorResponse, type Flavor, toApiError } from "./api_error.ts";
import { createCompletion } from "./completion.ts";
import type { JsonObject } from "./fields.ts";
import { detokenize, props, slots, tokenize } from "./llama_routes.ts";
import { createTextCompletion } from "./text_completions.ts";
import type { Head } from "./head_context.ts";
import { readJsonBody } from "./json_body.ts";
import { randomId } from "./random_id.ts";
import { countTokens, createMessage } from "./messages.ts";
import { renderMetrics, RequestCounter } from "./metrics.ts";
import { createChatCompletion } from "./openai.ts";

export interface HandlerOptions {
  /** When set, every route but /health needs it (x-api-key or Authorization: Bearer). */
  readonly apiKey?: string;
  /** Larger bodies are refused with 413. Default 32 MiB, Anthropic's limit. */
  readonly maxBodyBytes?: number;
  /**
   * Origins browsers may call from ("*" for any): CORS headers on every response and answers to
   * preflight OPTIONS requests. Without it no CORS header is sent.
   */
  readonly corsOrigins?: readonly string[];
}

type Handle = (request: Request) => Promise<Response>;

interface RouteContext {
  readonly request: Request;
  readonly url: URL;
  readonly requestId: string;
  /** The parsed JSON body (POST routes). */
  readonly body: JsonObject;
}

interface Route {
  readonly flavor: Flavor;
  readonly method: "GET" | "POST";
  /** Answered without an API key. */
  readonly open?: boolean;
  run(ctx: RouteContext): Response | Promise<Response>;
}

const KNOWN_ROUTES = "POST /v1/messages, POST /v1/messages/count_tokens, " +
  "POST /v1/chat/completions, POST /v1/completions, POST /completion, POST /tokenize, " +
  "POST /detokenize, GET /props, GET /slots, GET /v1/models, GET /health, GET /metrics";

/** Constant-time comparison, so response timing does not leak the key. */
function sameKey(a: string, b: string): boolean {
  const x = new TextEncoder().encode(a);
  const y = new TextEncoder().encode(b);
  let diff = x.length ^ y.length;
  for (let i = 0; i < Math.max(x.length, y.length); i++) diff |= (x[i] ?? 0) ^ (y[i] ?? 0);
  return diff === 0;
}

function presentedKey(request: Request): string | undefined {
  const direct = request.headers.get("x-api-key");
  if (direct !== null) return direct.trim();
  const auth = request.headers.get("authorization");
  const m = auth ? /^Bearer\s+(.+)$/i.exec(auth.trim()) : null;
  return m ? m[1] : undefined;
}

function modelObject(head: Head): Record<string, unknown> {
  return {
    id: head.modelId,
    type: "model",
    object: "model",
    display_name: head.modelId,
    created_at: "1970-01-01T00:00:00Z",
    created: 0,
    owned_by: "tandem",
    context_window: head.scheduler.ctx,
  };
}

function routes(head: Head, requests: RequestCounter): Map<string, Route> {
  const jsonHeaders = (requestId: string) => ({ headers: { "request-id": requestId } });
  return new Map<string, Route>([
    ["/v1/messages", {
      flavor: "anthropic",
      method: "POST",
      run: (c) => createMessage(head, c.body, c.requestId, c.request),
    }],
    ["/v1/messages/count_tokens", {
      flavor: "anthropic",
      method: "POST",
      run: (c) => countTokens(head, c.body, c.requestId),
    }],
    ["/v1/chat/completions", {
      flavor: "openai",
      method: "POST",
      run: (c) => createChatCompletion(head, c.body, c.requestId, c.request),
    }],
    ["/v1/completions", {
      flavor: "openai",
      method: "POST",
      run: (c) => createTextCompletion(head, c.body, c.requestId, c.request),
    }],
    ["/completion", {
      flavor: "llama",
      method: "POST",
      run: (c) => createCompletion(head, c.body, c.requestId, c.request),
    }],
    ["/tokenize", {
      flavor: "llama",
      method: "POST",
      run: (c) => tokenize(head, c.body, c.requestId),
    }],
    ["/detokenize", {
      flavor: "llama",
      method: "POST",
      run: (c) => detokenize(head, c.body, c.requestId),
    }],
    ["/props", { flavor: "llama", method: "GET", run: (c) => props(head, c.requestId) }],
    ["/slots", { flavor: "llama", method: "GET", run: (c) => slots(head, c.requestId, c.url) }],
    ["/v1/models", {
      flavor: "anthropic",
      method: "GET",
      run: (c) =>
        Response.json({
          object: "list",
          data: [modelObject(head)],
          has_more: false,
          first_id: head.modelId,
          last_id: head.modelId,
        }, jsonHeaders(c.requestId)),
    }],
    ["/health", {
      flavor: "llama",
      method: "GET",
      open: true,
      run: async (c) => {
        // ?scope=head: this process alone, without asking the next stage (liveness probes).
        const scope = new URL(c.request.url).searchParams.get("scope");
        if (scope === "head") return Response.json({ status: "ok", scope, model: head.modelId });
        if (scope !== null) {
          throw new ApiError(
            "invalid_request",
            `Cannot use scope "${scope}" on /health: expected "head", or no scope for the chain`,
          );
        }
        const h = await head.scheduler.health();
        const down = h.stages.filter((s) => s.up !== true);
        return Response.json({
          status: h.ok ? "ok" : "unavailable",
          ...(h.ok ? {} : {
            error: `stage ${down.map((s) => `${s.layers} (${s.where})`).join(", ")} is not ` +
              `answering: ${down.map((s) => s.error ?? "no contact yet").join("; ")}`,
          }),
          model: head.modelId,
          stages: h.stages.map((s) => ({
            layers: s.layers,
            where: s.where,
            up: s.up,
            last_rtt_ms: s.lastRttMs,
            last_answer_ms_ago: s.lastAnswerAgoMs,
            decode_ms_per_token: s.decodeMsPerToken,
            error: s.error,
          })),
          slots: { total: h.slots, busy: h.busy },
          queued: h.queued,
          cached_prefixes: h.cachedPrefixes,
        }, { status: h.ok ? 200 : 503 });
      },
    }],
    ["/metrics", {
      flavor: "llama",
      method: "GET",
      run: () =>
        new Response(renderMetrics(requests, head.scheduler, head.scheduler.link?.status()), {
          headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" },
        }),
    }],
    ["/", {
      flavor: "anthropic",
      method: "GET",
      run: () => Response.json({ status: "ok", model: head.modelId }),
    }],
    // Claude Code's connection warm-up probe.
    ["/api/hello", {
      flavor: "anthropic",
      method: "GET",
      run: () => Response.json({ status: "ok" }),
    }],
  ]);
}

function flavorOf(path: string): Flavor {
  if (path.startsWith("/v1/chat") || path.startsWith("/v1/completions")) return "openai";
  if (path.startsWith("/completion")) return "llama";
  return "anthropic";
}

/** Response headers a browser page may read. */
const EXPOSED = "request-id, retry-after, x-should-retry";

/**
 * The CORS origin to allow for `request`: "*" when any origin is, the request's own when listed,
 * or undefined (no CORS headers).
 */
function allowedOrigin(request: Request, origins: readonly string[] | undefined) {
  const origin = request.headers.get("origin");
  if (!origins?.length || origin === null) return undefined;
  if (origins.includes("*")) return "*";
  return origins.includes(origin) ? origin : undefined;
}

/** The answer to a CORS preflight for `route`: 204, with what the actual request may use. */
function preflight(request: Request, route: Route, origin: string): Response {
  const methods = route.method === "GET" ? "GET, HEAD, OPTIONS" : `${route.method}, OPTIONS`;
  return new Response(null, {
    status: 204,
    headers: {
      "access-control-allow-origin": origin,
      "access-control-allow-methods": methods,
      "access-control-allow-headers": request.headers.get("access-control-request-headers") ??
        "content-type, authorization, x-api-key, anthropic-version, anthropic-beta",
      "access-control-max-age": "600",
      vary: "origin",
    },
  });
}

/**
 * The head's request handler. Errors inside a route come back as that API's error shape; the
 * caller (Deno.serve's onError) holds the last line for anything that escapes.
 */
export function createHandler(head: Head, options: HandlerOptions = {}): Handle {
  const requests = new RequestCounter();
  const table = routes(head, requests);
  const limit = options.maxBodyBytes ?? 32 * 1024 * 1024;
  return async (request) => {
    const requestId = randomId("req_");
    const path = new URL(request.url).pathname.replace(/(.)\/+$/, "$1");
    const modelPath = path.startsWith("/v1/models/");
    const route = modelPath ? table.get("/v1/models") : table.get(path);
    const flavor = route?.flavor ?? flavorOf(path);
    const origin = allowedOrigin(request, options.corsOrigins);
    if (request.method === "OPTIONS" && route && origin) return preflight(request, route, origin);
    let response: Response;
    try {
      if (!route) {
        throw new ApiError(
          "not_found",
          `Not found: ${request.method} ${path}; this server answers ${KNOWN_ROUTES}`,
        );
      }
      const method = request.method === "HEAD" ? "GET" : request.method;
      if (method !== route.method) {
        throw new ApiError(
          "method_not_allowed",
          `Method ${request.method} is not allowed on ${path}; use ${route.method}`,
        );
      }
      if (options.apiKey !== undefined && !route.open) {
        const key = presentedKey(request);
        if (key === undefined || !sameKey(key, options.apiKey)) {
          throw new ApiError(
            "authentication",
            key === undefined
              ? "Missing API key: send it in the x-api-key header or as Authorization: Bearer"
              : "Invalid API key",
          );
        }
      }
      const body = method === "POST" ? await readJsonBody(request, limit) : {};
      response = modelPath
        ? Response.json(modelObject(head), { headers: { "request-id": requestId } })
        : await route.run({ request, url: new URL(request.url), requestId, body });
    } catch (e) {
      const error = toApiError(e);
      // An expected failure (a stage down, overload) is one line; only a bug gets its stack.
      if (error.kind === "internal") {
        head.log(
          `${request.method} ${path} failed: ${(error.cause as Error)?.stack ?? error.message}`,
        );
      } else if (error.status(flavor) >= 500) {
        head.log(`${request.method} ${path}: ${error.message}`);
      }
      response = errorResponse(error, flavor, requestId);
    }
    requests.count(route ? (modelPath ? "/v1/models/{id}" : path) : "other", response.status);
    if (origin) {
      response.headers.set("access-control-allow-origin", origin);
      response.headers.set("access-control-expose-headers", EXPOSED);
      response.headers.append("vary", "origin");
    }
    return response;
  };
}
