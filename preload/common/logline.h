/* One log line to stderr, shared by the preload library and the remote client, server and worker. */
#ifndef TESSERA_LOGLINE_H
#define TESSERA_LOGLINE_H

#include <stdarg.h>
#include <stddef.h>

/* Writes "<name>[<pid>] <level>: <message>\n" ("<name>[<pid>] <message>\n" when level is NULL),
 * truncated to cap bytes, in a single write so lines from many threads and processes do not
 * interleave. Hidden: it must never become part of a library's exported interface. */
__attribute__((visibility("hidden")))
void logline_write(size_t cap, const char *name, const char *level, const char *fmt, va_list ap);

#endif
