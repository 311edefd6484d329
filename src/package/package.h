/* package.h - a Splash package on disk, opened for reading.
 *
 * A package is a directory (the format is documented in docs/package-format.md):
 *
 *   manifest.json            format, architecture, dimensions, special
 *                            tokens, every tensor, every file with size+sha256
 *   target/embedding.bin     token embedding
 *   target/head.bin          final norm + lm_head
 *   target/layer-<i>.bin     everything of layer i
 *   target/mtp.bin           the checkpoint's mtp.* tensors, kept verbatim
 *   draft/...                a DFlash draft (later)
 *   tokenizer/               tokenizer.json, tokenizer_config.json,
 *                            chat_template.jinja (copied when present)
 *
 * Opening maps every .bin file read-only and resolves each manifest tensor to
 * a splash_tensor pointing into the map.  Nothing is copied: weights stay
 * quantised in the page cache, shared between processes.
 */
#ifndef SPLASH_PACKAGE_H
#define SPLASH_PACKAGE_H

#include <stddef.h>
#include <stdint.h>

#include "base/json.h"
#include "base/status.h"
#include "package/tensor.h"

#define SPLASH_PACKAGE_FORMAT "splash-package"
#define SPLASH_PACKAGE_VERSION 1
#define SPLASH_SECTION_ALIGN 16384 /* each .bin file is padded to this */
#define SPLASH_TENSOR_ALIGN 64     /* each tensor (and each part) starts here */

typedef struct splash_package splash_package;

/* Opens and maps a package directory; checks the manifest's format name and
 * version, that every listed file exists with its listed size, and that every
 * tensor lies inside its file.  Does NOT re-hash (that is `splash verify`). */
int splash_package_open(const char *dir, splash_package **out, splash_error *err);
void splash_package_close(splash_package *pkg);

const char *splash_package_dir(const splash_package *pkg);
const json_value *splash_package_manifest(const splash_package *pkg);
/* manifest "architecture": "qwen3_5" or "qwen3_5_moe" */
const char *splash_package_architecture(const splash_package *pkg);

/* Tensor lookup by canonical name ("layers.3.attn.q_proj").  _find returns
 * NULL when absent; _get fails with a message naming the tensor and, when
 * the tensor exists, its actual vs expected dtype class and shape.
 * Shape check: ndim and each dim must match `shape` (pass ndim 0 to skip). */
const splash_tensor *splash_package_find(const splash_package *pkg, const char *name);
int splash_package_get(const splash_package *pkg, const char *name, int ndim, const int64_t *shape,
                       const splash_tensor **out, splash_error *err);
size_t splash_package_tensor_count(const splash_package *pkg);
const splash_tensor *splash_package_tensor_at(const splash_package *pkg, size_t i);

/* Path of a file inside the package (tokenizer/tokenizer.json...); NULL if the
 * manifest does not list it.  The string belongs to the package. */
const char *splash_package_file(const splash_package *pkg, const char *relpath);

/* Re-hashes every file against the manifest.  Prints progress to stderr when
 * verbose.  Returns SPLASH_E_MISMATCH naming the first bad file. */
int splash_package_verify(const char *dir, int verbose, splash_error *err);

#endif
