/* Memory accounting across fork: the child has its own slot, and its bytes come back when it exits. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    unsigned long long cap = strtoull(argv[1], NULL, 10);
    cuInit(0);
    CUdeviceptr p;
    printf("parent_30=%d\n", cuMemAlloc(&p, cap * 3 / 10));
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        CUdeviceptr q;
        printf("child_30=%d\n", cuMemAlloc(&q, cap * 3 / 10));
        printf("child_50=%d\n", cuMemAlloc(&q, cap / 2));
        fflush(stdout);
        _exit(0);   /* exits holding its 30% */
    }
    int status;
    waitpid(child, &status, 0);
    printf("parent_60=%d\n", cuMemAlloc(&p, cap * 6 / 10));
    return 0;
}
