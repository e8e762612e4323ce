/* Which symbols the shared runtime library exports: the runtime's sources
 * are compiled with -fvisibility=hidden and with this header force-included
 * (-include) first, so the declarations of the public API (include/loraplex.h)
 * -- and only those -- get default visibility, which their definitions then
 * inherit. Everything else (lp_gguf_*, lp_alloc, ...) stays internal to
 * libloraplex.so; the static library keeps it all for the tools and tests. */
#ifndef LP_EXPORT_H
#define LP_EXPORT_H

#pragma GCC visibility push(default)
#include "loraplex.h"
#pragma GCC visibility pop

#endif
