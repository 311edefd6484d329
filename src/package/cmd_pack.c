/* cmd_pack.c - `splash pack` and `splash verify`: argument parsing and the
 * summary lines; the work is in packer.c and package.c. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "package/package.h"
#include "package/packer.h"

static void pack_usage(FILE *f) {
    fprintf(f,
            "usage: splash pack --from HF_DIR --out PKG [--weights q4|q8|bf16] [--draft DRAFT_DIR]\n"
            "                   [--threads N] [--force] [--quiet] [--default-reasoning-effort none|...|max]\n"
            "                   [--default-block-size N]\n"
            "       splash pack --into PKG --draft DRAFT_DIR [--weights q4|q8|bf16] [--threads N] [--force] [--quiet]\n"
            "                   [--default-block-size N]\n"
            "\n"
            "Turns a Qwen3.5 checkpoint (Hugging Face or mlx-lm: config.json, *.safetensors,\n"
            "tokenizer files) into a Splash package directory (docs/package-format.md).\n"
            "  --weights  q4 (default): affine 4-bit group 64; q8: 8-bit; bf16: unquantised\n"
            "  --draft    also pack a DFlash draft (DFlashDraftModel or DFlash2DraftModel) for it\n"
            "  --into     attach the --draft to an existing PKG instead, without the target's\n"
            "             checkpoint: checked against PKG's target, target files untouched, the\n"
            "             result the same as packing both in one go; --weights defaults to PKG's;\n"
            "             --force replaces a draft PKG already has; on failure PKG is unchanged\n"
            "  --force    replace an existing PKG\n"
            "  --default-reasoning-effort  what `splash serve` uses when neither the request nor\n"
            "             its own flag sets one (none: a model trained without thinking)\n"
            "  --default-block-size  1..16: the decode block `splash serve` uses when neither the\n"
            "             request nor --block-size sets one (default: the draft's own; 1 keeps the\n"
            "             draft off unless asked for, where it measured slower than plain decode)\n"
            "  --threads  quantisation threads (default: every CPU)\n"
            "Nothing is left at PKG when packing fails.\n");
}

static const char *human(uint64_t n, char *buf, size_t size) {
    if (n >= (1ull << 30)) snprintf(buf, size, "%.2f GiB", (double)n / (double)(1ull << 30));
    else if (n >= (1ull << 20)) snprintf(buf, size, "%.2f MiB", (double)n / (double)(1ull << 20));
    else if (n >= 1024) snprintf(buf, size, "%.1f KiB", (double)n / 1024.0);
    else snprintf(buf, size, "%" PRIu64 " B", n);
    return buf;
}

static int pack_into(splash_pack_options *opt, int quiet) {
    opt->progress = !quiet && isatty(2);
    splash_pack_stats st;
    splash_error err = {0};
    if (splash_pack_draft_into(opt, &st, &err)) {
        fprintf(stderr, "splash pack: %s\n", err.msg);
        return 1;
    }
    if (!quiet) {
        char b[32];
        printf("attached a %s draft from %s to %s in %.2f s\n", st.architecture, opt->draft, opt->into, st.seconds);
        printf("  %zu tensors in %zu files, %s in total\n", st.tensors, st.files, human(st.total_bytes, b, sizeof b));
    }
    return 0;
}

int splash_cmd_pack(int argc, char **argv) {
    splash_pack_options opt = {.weights = SPLASH_Q4};
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            pack_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--force")) {
            opt.force = 1;
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!v) {
            fprintf(stderr, "splash pack: %s needs a value (or is unknown)\n\n", a);
            pack_usage(stderr);
            return 2;
        } else if (!strcmp(a, "--from")) {
            opt.from = v, i++;
        } else if (!strcmp(a, "--into")) {
            opt.into = v, i++;
        } else if (!strcmp(a, "--out")) {
            opt.out = v, i++;
        } else if (!strcmp(a, "--default-reasoning-effort") && v) {
            static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max"};
            int ok = 0;
            for (size_t k = 0; k < sizeof efforts / sizeof efforts[0]; k++) ok |= !strcmp(v, efforts[k]);
            if (!ok) {
                fprintf(stderr, "splash pack: --default-reasoning-effort %s: expected none, minimal, low, medium, high, "
                                "xhigh or max\n", v);
                return 2;
            }
            opt.default_reasoning_effort = v, i++;
        } else if (!strcmp(a, "--default-block-size") && v) {
            opt.default_block_size = atoi(v);
            if (opt.default_block_size < 1 || opt.default_block_size > 16) {
                fprintf(stderr, "splash pack: --default-block-size %s: expected 1..16\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--draft")) {
            opt.draft = v, i++;
        } else if (!strcmp(a, "--threads")) {
            opt.threads = atoi(v), i++;
        } else if (!strcmp(a, "--weights")) {
            int t = splash_dtype_parse(v);
            if (t != SPLASH_Q4 && t != SPLASH_Q8 && t != SPLASH_BF16) {
                fprintf(stderr, "splash pack: --weights %s: expected q4, q8 or bf16\n", v);
                return 2;
            }
            opt.weights = (splash_dtype)t, opt.weights_given = 1, i++;
        } else {
            fprintf(stderr, "splash pack: unknown option %s\n\n", a);
            pack_usage(stderr);
            return 2;
        }
    }
    if (opt.into) {
        if (opt.from || opt.out || opt.default_reasoning_effort || !opt.draft) {
            fprintf(stderr, "splash pack: --into takes --draft, and not --from, --out or --default-reasoning-effort\n\n");
            pack_usage(stderr);
            return 2;
        }
        return pack_into(&opt, quiet);
    }
    if (!opt.from || !opt.out) {
        fprintf(stderr, "splash pack: --from and --out are required\n\n");
        pack_usage(stderr);
        return 2;
    }
    opt.progress = !quiet && isatty(2);
    splash_pack_stats st;
    splash_error err = {0};
    int rc = splash_pack(&opt, &st, &err);
    if (rc) {
        fprintf(stderr, "splash pack: %s\n", err.msg);
        return 1;
    }
    if (!quiet) {
        char b[32];
        printf("packed %s (%s) from %s into %s in %.2f s\n", st.architecture, splash_dtype_name(opt.weights), opt.from,
               opt.out, st.seconds);
        printf("  %zu tensors in %zu files, %s in total\n", st.tensors, st.files, human(st.total_bytes, b, sizeof b));
        printf("  by dtype:");
        for (int d = 0; d < SPLASH_DTYPE_COUNT; d++)
            if (st.bytes_by_dtype[d]) printf(" %s %s", splash_dtype_name((splash_dtype)d), human(st.bytes_by_dtype[d], b, sizeof b));
        printf("\n");
        if (st.mtp_tensors) printf("  %zu mtp tensors kept in target/mtp.bin\n", st.mtp_tensors);
        if (st.copied_quantized || st.requantized)
            printf("  MLX tensors: %zu codes copied, %zu re-encoded\n", st.copied_quantized, st.requantized);
    }
    return 0;
}

int splash_cmd_verify(int argc, char **argv) {
    const char *dir = NULL;
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: splash verify PKG [--quiet]\n\nRe-hashes every file of a package against its manifest "
                   "(size and SHA-256); exits 1 at the first mismatch.\n");
            return 0;
        } else if (!strcmp(argv[i], "--quiet")) {
            quiet = 1;
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "usage: splash verify PKG [--quiet]\n");
            return 2;
        } else {
            dir = argv[i];
        }
    }
    if (!dir) {
        fprintf(stderr, "usage: splash verify PKG [--quiet]\n");
        return 2;
    }
    splash_error err = {0};
    int rc = splash_package_verify(dir, !quiet, &err);
    if (rc) {
        fprintf(stderr, "splash verify: %s\n", err.msg);
        return 1;
    }
    return 0;
}
