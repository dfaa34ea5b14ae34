/* Takes GPU memory in chunks until refused (or a chunk limit), reports it, and holds it.
 *   hog <chunk-bytes> <max-chunks> <hold-ms> [start-file [gap-us]]
 * With a start file, waits until it exists, so many hogs race at once; gap-us spaces the chunks. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: hog <chunk-bytes> <max-chunks> <hold-ms> [start-file]\n");
        return 2;
    }
    unsigned long long chunk = strtoull(argv[1], NULL, 10), max = strtoull(argv[2], NULL, 10);
    long hold = atol(argv[3]);
    cuInit(0);
    if (argc > 4)
        while (access(argv[4], F_OK) != 0) usleep(1000);
    useconds_t gap = argc > 5 ? (useconds_t)atol(argv[5]) : 0;
    unsigned long long total = 0, n = 0;
    CUresult last = CUDA_SUCCESS;
    while (n < max) {
        CUdeviceptr p;
        last = cuMemAlloc(&p, chunk);
        if (last != CUDA_SUCCESS) break;
        total += chunk;
        n++;
        if (gap) usleep(gap);
    }
    printf("allocated=%llu last=%d\n", total, last);
    fflush(stdout);
    usleep((useconds_t)hold * 1000);
    return 0;
}
