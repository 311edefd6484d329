/* rope.c - partial rotary position embedding (NEOX pairing), as transformers'
 * Qwen3.5 text rotary: inv_freq[i] = 1 / theta^(2i / rot_dim) in fp32, angle
 * = pos * inv_freq[i] in fp32, dims i and i + rot_dim/2 rotated together,
 * dims >= rot_dim passed through.  (Text positions make the three mRoPE
 * components equal, so one position suffices.) */
#include <math.h>

#include "backend/cpu/cpu.h"

#define MAX_HALF 512

void cpu_rope(float *x, int n_heads, int head_dim, int rot_dim, double theta, int32_t pos) {
    int half = rot_dim / 2;
    if (half > MAX_HALF) half = MAX_HALF; /* dims are validated at load; never reached */
    float cs[MAX_HALF], sn[MAX_HALF];
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)rot_dim;
        float inv = 1.0f / powf((float)theta, e);
        float a = (float)pos * inv;
        cs[i] = cosf(a);
        sn[i] = sinf(a);
    }
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float x1 = v[i], x2 = v[i + half];
            v[i] = x1 * cs[i] - x2 * sn[i];
            v[i + half] = x2 * cs[i] + x1 * sn[i];
        }
    }
}
