/* An interposer of its own, loaded after the Tessera library: it wraps getpid and finds the real one
 * with dlsym(RTLD_NEXT). If the replaced dlsym resolved RTLD_NEXT relative to itself instead of
 * to its caller, this would get its own wrapper back and recurse. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

pid_t getpid(void) {
    static pid_t (*real)(void);
    if (!real) {
        real = (pid_t (*)(void))dlsym(RTLD_NEXT, "getpid");
        if (real == getpid || !real) {
            fputs("next_lib: dlsym(RTLD_NEXT) returned the wrapper itself\n", stderr);
            abort();
        }
        fputs("next_ok=1\n", stderr);
    }
    return real();
}
