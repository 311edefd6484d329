/* default_model.h - where the default model that ships with Splash lives.
 *
 * `splash serve` without --model serves the package committed to the
 * repository at models/splash-demo (docs/default-model.md: a small code model
 * trained for Splash, not a Qwen model).  The binary finds it without being
 * told, wherever it was built or installed:
 *   1. $SPLASH_DEFAULT_MODEL, when set (a package directory);
 *   2. <dir of the executable>/../models/splash-demo  (a build tree: build/splash);
 *   3. <dir of the executable>/../share/splash/models/splash-demo  (an install prefix).
 * The first that holds a manifest.json wins.
 */
#ifndef SPLASH_DEFAULT_MODEL_H
#define SPLASH_DEFAULT_MODEL_H

#include "base/status.h"

#define SPLASH_DEFAULT_MODEL_NAME "splash-demo"

/* The default package's directory (free() it), or fails with
 * SPLASH_E_NOTFOUND naming every place it looked. */
int splash_default_model_dir(char **out, splash_error *err);

#endif
