// Loopback recorder (README.md): `node record_proxy.mjs LISTEN_PORT SPLASH_PORT LOG_DIR` with env
// SCRIPTS = a JSON file holding a list of scripted model turns.  Logs every request to LOG_DIR,
// forwards it to `splash serve --test-hooks`, and gives each request that carries the agent's tools
// (more than 3) the next script as its test_script, so the random test model "calls" a tool.
import http from "node:http";
import fs from "node:fs";
const [, , listenPort, upstreamPort, logDir] = process.argv;
let n = 0, mainTurns = 0;
const scripts = JSON.parse(fs.readFileSync(process.env.SCRIPTS, "utf8"));
http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
        const body = Buffer.concat(chunks).toString("utf8");
        const id = String(++n).padStart(3, "0");
        let json = null;
        try { json = JSON.parse(body); } catch {}
        fs.writeFileSync(`${logDir}/${id}-${req.method}${req.url.replace(/[^a-z0-9]+/gi, "_")}.json`,
            JSON.stringify({ method: req.method, url: req.url, headers: req.headers, body: json ?? body }, null, 1));
        let out = body;
        const isMain = json && Array.isArray(json.tools) && json.tools.length > 3;
        if (isMain) {
            const s = scripts[Math.min(mainTurns, scripts.length - 1)];
            mainTurns++;
            json.test_script = s;
            out = JSON.stringify(json);
        }
        const up = http.request({ host: "127.0.0.1", port: upstreamPort, method: req.method, path: req.url,
            headers: { ...req.headers, host: "127.0.0.1", "content-length": Buffer.byteLength(out) } }, (ur) => {
            res.writeHead(ur.statusCode, ur.headers);
            ur.pipe(res);
        });
        up.on("error", (e) => { res.writeHead(502); res.end(String(e)); });
        up.end(out);
    });
}).listen(Number(listenPort), "127.0.0.1", () => console.log("proxy on", listenPort));
