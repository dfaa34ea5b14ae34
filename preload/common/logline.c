#include "logline.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void logline_write(size_t cap, const char *name, const char *level, const char *fmt, va_list ap) {
    char line[cap];   /* cap is each caller's constant; kept small for programs with small thread stacks */
    int n = level ? snprintf(line, cap, "%s[%d] %s: ", name, (int)getpid(), level)
                  : snprintf(line, cap, "%s[%d] ", name, (int)getpid());
    vsnprintf(line + n, cap - (size_t)n - 1, fmt, ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, line, len);
    (void)ignored;
}
