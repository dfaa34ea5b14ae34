/* Allocates, then execs itself: the memory of the old image must not stay counted. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    unsigned long long cap = strtoull(argv[2], NULL, 10);
    cuInit(0);
    CUdeviceptr p;
    CUresult r = cuMemAlloc(&p, cap * 7 / 10);
    if (!strcmp(argv[1], "first")) {
        printf("before_exec=%d\n", r);
        fflush(stdout);
        execl("/proc/self/exe", argv[0], "second", argv[2], (char *)NULL);
        return 3;
    }
    printf("after_exec=%d\n", r);
    return 0;
}
