/* packer.h - a Hugging Face (or mlx-lm) Qwen3.5 checkpoint into a Splash
 * package (`splash pack`).
 *
 * The packer reads config.json and the safetensors, maps every checkpoint
 * tensor the model needs to its canonical name and shape (docs/package-format.md),
 * checks all of them BEFORE writing anything, then writes the package into a
 * temporary directory beside the target, fsyncs it and renames it into place.
 * Any failure removes the temporary directory, so a package either exists
 * whole or not at all.
 */
#ifndef SPLASH_PACKER_H
#define SPLASH_PACKER_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "package/tensor.h"

typedef struct splash_pack_options {
    const char *from;     /* checkpoint directory (config.json, *.safetensors) */
    const char *draft;    /* DFlash v1 draft checkpoint (z-lab DFlashDraftModel), or NULL */
    const char *out;      /* package directory to create */
    splash_dtype weights; /* SPLASH_Q4 (default), SPLASH_Q8 or SPLASH_BF16 */
    int threads;          /* <= 0: every CPU */
    int force;            /* replace an existing package at `out` */
    int progress;         /* print a line per layer on stderr */
    const char *default_reasoning_effort; /* manifest "serving.reasoning_effort" (a model trained
                                             without thinking: "none"), or NULL */
    int default_block_size; /* manifest "serving.block_size" (1..16: the decode block `splash serve`
                               uses when neither its flag nor the request sets one), or 0 */
    const char *into;     /* splash_pack_draft_into: the existing package the draft goes into */
    int weights_given;    /* splash_pack_draft_into: use `weights` for the draft; else the draft is
                             quantised as the package's target (manifest quantization.weights) */
} splash_pack_options;

typedef struct splash_pack_stats {
    size_t tensors;                          /* in the manifest */
    size_t files;                            /* in the manifest */
    uint64_t bytes_by_dtype[SPLASH_DTYPE_COUNT]; /* tensor bytes */
    uint64_t total_bytes;                    /* all files */
    size_t mtp_tensors, vision_skipped, unused;
    size_t copied_quantized;                 /* MLX tensors whose codes were copied */
    size_t requantized;                      /* MLX tensors dequantised and re-encoded */
    double seconds;
    char architecture[32];
} splash_pack_stats;

int splash_pack(const splash_pack_options *opt, splash_pack_stats *stats, splash_error *err);

/* `splash pack --into PKG --draft DIR`: attaches (with opt->force: replaces) a
 * DFlash draft in an existing package without its target checkpoint.  The
 * draft is checked against the target dimensions in PKG's manifest by the
 * same code as --draft; target files are not touched; draft files and the new
 * manifest are written under temporary names and renamed in, the manifest
 * last, so a failure leaves PKG as it was.  Uses into, draft, weights and
 * weights_given, threads, force, progress.  stats->architecture is the
 * draft's ("dflash" or "dflash2"); the counts are the draft's. */
int splash_pack_draft_into(const splash_pack_options *opt, splash_pack_stats *stats, splash_error *err);

#endif
