// HTTP errors in one table: each kind's status and type per API flavor, and their two encodings
// (a JSON response before the 200, an SSE error frame after it). Used by every lib/server route.

import { GrammarError } from "../grammar/grammar.ts";
import { OverloadedError } from "../scheduler/scheduler.ts";
import { StageUnavailableError } from "../wire/peer.ts";

/** Which API's conventions an error is written in. */
export type Flavor = "anthropic" | "openai" | "llama";

export type ErrorKind =
  | "invalid_request"
  | "authentication"
  | "not_found"
  | "method_not_allowed"
  | "request_too_large"
  | "overloaded"
  | "stage_unavailable"
  | "internal";

interface KindRow {
  readonly anthropic: readonly [number, string];
  readonly openai: readonly [number, string];
  readonly llama: readonly [number, string];
}

/**
 * The one status/type table. Anthropic's types are its documented ones; OpenAI's and llama.cpp's
 * are what their servers send. Admission overload is 529 for Anthropic clients (they retry it)
 * and 429 for OpenAI ones (which know no 529); a missing stage is 503 everywhere.
 */
const TABLE: Readonly<Record<ErrorKind, KindRow>> = {
  invalid_request: {
    anthropic: [400, "invalid_request_error"],
    openai: [400, "invalid_request_error"],
    llama: [400, "invalid_request_error"],
  },
  authentication: {
    anthropic: [401, "authentication_error"],
    openai: [401, "invalid_request_error"],
    llama: [401, "authentication_error"],
  },
  not_found: {
    anthropic: [404, "not_found_error"],
    openai: [404, "invalid_request_error"],
    llama: [404, "not_found_error"],
  },
  method_not_allowed: {
    anthropic: [405, "invalid_request_error"],
    openai: [405, "invalid_request_error"],
    llama: [405, "invalid_request_error"],
  },
  request_too_large: {
    anthropic: [413, "request_too_large"],
    openai: [413, "invalid_request_error"],
    llama: [413, "invalid_request_error"],
  },
  overloaded: {
    anthropic: [529, "overloaded_error"],
    openai: [429, "rate_limit_exceeded"],
    llama: [503, "unavailable_error"],
  },
  stage_unavailable: {
    anthropic: [503, "overloaded_error"],
    openai: [503, "server_error"],
    llama: [503, "unavailable_error"],
  },
  internal: {
    anthropic: [500, "api_error"],
    openai: [500, "server_error"],
    llama: [500, "server_error"],
  },
};

export interface ApiErrorOptions extends ErrorOptions {
  /** The request field at fault, as a dotted path (`messages.0.content`). */
  readonly param?: string;
  /** Seconds a client should wait before retrying; sent as retry-after. */
  readonly retryAfter?: number;
}

/** An error with an HTTP meaning. Everything the server answers with is one of these. */
export class ApiError extends Error {
  override name = "ApiError";
  readonly kind: ErrorKind;
  readonly param: string | undefined;
  readonly retryAfter: number | undefined;

  constructor(kind: ErrorKind, message: string, options: ApiErrorOptions = {}) {
    super(message, options);
    this.kind = kind;
    this.param = options.param;
    this.retryAfter = options.retryAfter;
  }

  status(flavor: Flavor): number {
    return TABLE[this.kind][flavor][0];
  }

  type(flavor: Flavor): string {
    return TABLE[this.kind][flavor][1];
  }

  /** The error body in `flavor`'s shape. */
  body(flavor: Flavor, requestId: string): Record<string, unknown> {
    const type = this.type(flavor);
    switch (flavor) {
      case "anthropic":
        return { type: "error", error: { type, message: this.message }, request_id: requestId };
      case "openai":
        return {
          error: { message: this.message, type, param: this.param ?? null, code: null },
        };
      case "llama":
        return { error: { code: this.status(flavor), message: this.message, type } };
    }
  }
}

/** A bad request field: the message starts with the field's path, as Anthropic's do. */
export function invalidField(param: string, problem: string): ApiError {
  return new ApiError("invalid_request", `${param}: ${problem}`, { param });
}

/** Any thrown value as an ApiError: a stage failure is 503, anything unexpected 500. */
export function toApiError(e: unknown): ApiError {
  if (e instanceof ApiError) return e;
  if (e instanceof OverloadedError) {
    return new ApiError("overloaded", e.message, { retryAfter: e.retryAfter, cause: e });
  }
  if (e instanceof StageUnavailableError) {
    return new ApiError(
      "stage_unavailable",
      `A pipeline stage is unavailable: ${e.message}; retry once it is back (see GET /health)`,
      { retryAfter: 1, cause: e },
    );
  }
  if (e instanceof GrammarError) {
    // A grammar that turns out unusable while it runs (too ambiguous, too many pattern states).
    return new ApiError("invalid_request", `Cannot follow the requested grammar: ${e.message}`, {
      cause: e,
    });
  }
  const message = e instanceof Error ? e.message : String(e);
  return new ApiError("internal", `Internal error: ${message}`, { cause: e });
}

/** The error as a JSON response, with request-id, retry-after and x-should-retry headers. */
export function errorResponse(error: ApiError, flavor: Flavor, requestId: string): Response {
  const status = error.status(flavor);
  const headers = new Headers({ "content-type": "application/json", "request-id": requestId });
  if (error.retryAfter !== undefined) headers.set("retry-after", String(error.retryAfter));
  // A 4xx other than overload fails the same way when repeated.
  if (status < 500 && status !== 429) headers.set("x-should-retry", "false");
  return new Response(JSON.stringify(error.body(flavor, requestId)), { status, headers });
}
