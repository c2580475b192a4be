// The Vercel AI SDK's tool set over one sandboxd session (an optional entry
// point: `import { sandboxdTools } from "sandboxd/ai"` needs the `ai` package).
//
//   const session = await client.session();
//   const { text } = await generateText({ model, tools: await sandboxdTools(session), stopWhen: stepCountIs(5), prompt });
//
// The tools are the daemon's own (GET /v1/tools: the definitions MCP serves, their
// descriptions stating the policy's limits), bound to the session: the model never
// names one, and every call runs in it. A figure comes back to the model as an image.

import { jsonSchema, tool, type ToolSet } from "ai";
import type { Session } from "./index.js";

/** The tools that act inside one session (the others make or close sessions). */
const SESSION_TOOLS = ["run_python", "run_shell", "install_packages", "upload_file", "list_files", "read_file"];

/** What a sandboxd tool answers: its text, its images (base64), and whether it failed. */
export interface SandboxdToolOutput {
  text: string;
  images: { data: string; mediaType: string }[];
  isError: boolean;
}

type Block = { type: string; text?: string; source?: { data?: string; media_type?: string } };

/** The session's tools as an AI SDK `ToolSet` (`only` picks some by name). */
export async function sandboxdTools(session: Session, options: { only?: string[] } = {}): Promise<ToolSet> {
  const wanted = options.only ?? SESSION_TOOLS;
  const unknown = wanted.filter((n) => !SESSION_TOOLS.includes(n));
  if (unknown.length) throw new TypeError(`not tools of a session: ${unknown.join(", ")}; use some of ${SESSION_TOOLS.join(", ")}`);
  const defs = (await session.client.tools.definitions("anthropic")) as {
    name: string;
    description: string;
    input_schema: { properties?: Record<string, unknown>; required?: string[] } & Record<string, unknown>;
  }[];
  const set: ToolSet = {};
  for (const def of defs) {
    if (!wanted.includes(def.name)) continue;
    // The session is the set's: the model does not name one.
    const properties = { ...(def.input_schema.properties ?? {}) };
    delete properties.session_id;
    const schema = {
      ...def.input_schema,
      properties,
      required: (def.input_schema.required ?? []).filter((r) => r !== "session_id"),
    };
    set[def.name] = tool({
      description: def.description,
      inputSchema: jsonSchema<Record<string, unknown>>(schema as Parameters<typeof jsonSchema>[0]),
      execute: async (input: Record<string, unknown>, { abortSignal }): Promise<SandboxdToolOutput> => {
        const answer = await session.client.tools.call(
          def.name,
          { ...input, session_id: session.id },
          { format: "anthropic", signal: abortSignal },
        );
        const blocks = (answer.content ?? []) as Block[];
        return {
          text: blocks.filter((b) => b.type === "text").map((b) => b.text ?? "").join("\n"),
          images: blocks
            .filter((b) => b.type === "image" && b.source?.data)
            .map((b) => ({ data: b.source?.data ?? "", mediaType: b.source?.media_type ?? "image/png" })),
          isError: answer.is_error === true,
        };
      },
      toModelOutput: (out: SandboxdToolOutput) =>
        out.images.length === 0
          ? { type: out.isError ? "error-text" : "text", value: out.text }
          : {
              type: "content",
              value: [
                { type: "text", text: out.text },
                ...out.images.map((i) => ({ type: "media" as const, data: i.data, mediaType: i.mediaType })),
              ],
            },
    });
  }
  return set;
}
