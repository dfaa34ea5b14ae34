#include "logline.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void logline_write(size_t cap, const char *name, const char *level, const char *fmt, va_list ap) {
    char line[cap], msg[cap];   /* cap is each caller's constant; kept small for programs with small thread stacks */
    int n = level ? snprintf(line, cap, "%s[%d] %s: ", name, (int)getpid(), level)
                  : snprintf(line, cap, "%s[%d] ", name, (int)getpid());
    if (n < 0 || (size_t)n > cap - 1) n = (int)cap - 1;
    vsnprintf(msg, cap, fmt, ap);
    /* Messages carry what others chose (a client's kernel names, paths): control bytes are written as
     * \xNN and a backslash as \\, so that one call is one line and no text can pose as another line
     * or drive the terminal that shows it. */
    size_t len = (size_t)n, room = cap - 1;   /* the newline's byte */
    for (const unsigned char *c = (const unsigned char *)msg; *c; c++) {
        int plain = *c >= 0x20 && *c != 0x7f && *c != '\\';
        size_t need = plain ? 1 : *c == '\\' ? 2 : 4;
        if (len + need > room) break;
        if (plain) line[len] = (char)*c;
        else if (*c == '\\') memcpy(line + len, "\\\\", 2);
        else snprintf(line + len, 5, "\\x%02x", *c);
        len += need;
    }
    line[len++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, line, len);
    (void)ignored;
}
