/* chat_template.h - the Qwen3.5/3.6 chat template, rendered natively in C.
 *
 * Splash does not embed a Jinja interpreter.  The model family ships one chat
 * template (qwen3.6-chat_template.jinja); chat_template.c is that template
 * translated statement by statement into C, with Python's semantics where they
 * show in the output: `tojson` is json.dumps(ensure_ascii=False) (base/json.h's
 * JSON_PYTHON), `|trim` strips Python's Unicode whitespace, a non-string
 * printed by `{{ }}` is Python's str(), and the template's raise_exception()
 * calls become SPLASH_E_TEMPLATE errors carrying the template's own message.
 * The output is byte-identical to transformers' apply_chat_template (tests:
 * tests/node/chat_template.test.mjs against @huggingface/jinja and against
 * renderings made with Python Jinja).
 *
 * Because the translation is fixed, a checkpoint whose chat_template.jinja is
 * not the known text still renders as the known template; callers report that
 * with splash_chat_template_identify() (`Chat template · native`).
 */
#ifndef SPLASH_CHAT_TEMPLATE_H
#define SPLASH_CHAT_TEMPLATE_H

#include <stddef.h>

#include "base/json.h"
#include "base/status.h"
#include "base/strbuf.h"

/* Renders a chat request to the prompt text, appending it to *out.
 *
 * request: a JSON object whose keys are the template's variables:
 *   messages             list of {role, content, reasoning_content?, tool_calls?}
 *                        role: system (first only) | user | assistant | tool;
 *                        content: string, null, or a list of parts
 *                        ({type:"text",text} | {type:"image"|image|image_url}
 *                        | {type:"video"|video})
 *   tools                list of tool schemas (written with tojson)
 *   add_generation_prompt, enable_thinking, preserve_thinking, add_vision_id
 *                        tested as the template tests them (truthiness, or
 *                        `is true` / `is false` for the two thinking flags)
 * Other keys are ignored, as Jinja ignores unused variables.  Tool-call
 * `arguments` must be objects, as in the template (`|items`); an OpenAI-style
 * JSON string raises "Can only get item pairs from a mapping." exactly as
 * transformers does, so API layers decode those strings first.
 *
 * Returns 0, or SPLASH_E_TEMPLATE with the template's message (e.g. "No user
 * query found in messages.") or the message Python Jinja would raise for a
 * malformed value, SPLASH_E_INVALID if request is not an object, or
 * SPLASH_E_NOMEM.  On failure *out is restored to its length on entry.
 * Deterministic: the same request always renders the same bytes. */
int splash_chat_template_render(const json_value *request, strbuf *out, splash_error *err);

/* The known template's text (src/text/qwen36_template.inc), NUL-terminated. */
const char *splash_chat_template_builtin(size_t *len);

/* Reads a checkpoint's chat template from a tokenizer directory: the file
 * chat_template.jinja, else the "chat_template" string of
 * tokenizer_config.json (or its entry named "default" when it is a list).
 * *text is NUL-terminated; free() it.  SPLASH_E_NOTFOUND when neither has
 * one, SPLASH_E_IO / SPLASH_E_FORMAT when a file is unreadable or bad. */
int splash_chat_template_read_dir(const char *dir, char **text, size_t *len, splash_error *err);

/* Compares a checkpoint's chat_template.jinja text with the known template(s),
 * ignoring trailing whitespace at the end of the file.  Returns the static
 * string "native" when it is one of them; otherwise writes a one-line
 * description of the first difference into buf and returns buf. */
const char *splash_chat_template_identify(const char *text, size_t len, char *buf, size_t size);

#endif
