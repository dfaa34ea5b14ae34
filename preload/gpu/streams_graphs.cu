// CUDA graphs and per-thread default streams under the preload library's cap and share, on a real
// GPU (preload/gpu_check.py). Built with `nvcc --default-stream per-thread`, so the runtime reaches
// the driver's _ptsz entry points. Prints key=value lines (errors are cudaError_t numbers).
//   streams_graphs CAP_BYTES
// threads_ok: four threads each allocate on their default stream (cudaMallocAsync), fill, check.
// graph_ok: a captured graph of kernels replayed 100 times gives the eager result.
// ptsz_over: a stream-ordered allocation past the cap on the per-thread stream (want 2: out of memory).
// node_*: after most of the cap is taken, a graph that allocates inside itself (stream capture of
// cudaMallocAsync: a memory node, whose memory the driver maps at launch) must not take more than the
// cap: node_instantiate / node_launch say where it was refused, node_used_high the bytes the driver's
// graph pool really took.
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#include <cuda_runtime.h>

__global__ void fill(float *p, size_t n, float v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}
__global__ void axpy(float *y, const float *x, size_t n, float a) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = a * x[i] + y[i];
}

static int thread_check(int id) {
    const size_t n = 16 << 20;
    float *p = nullptr;
    if (cudaMallocAsync(&p, n * sizeof(float), 0) != cudaSuccess) return 0;
    fill<<<256, 256>>>(p, n, (float)id);
    std::vector<float> host(n);
    cudaMemcpyAsync(host.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost, 0);
    cudaStreamSynchronize(0);
    cudaFreeAsync(p, 0);
    cudaStreamSynchronize(0);
    for (size_t i = 0; i < n; i += 4099)
        if (host[i] != (float)id) return 0;
    return cudaGetLastError() == cudaSuccess;
}

int main(int argc, char **argv) {
    size_t cap = argc > 1 ? strtoull(argv[1], nullptr, 10) : (size_t)2 << 30;
    cudaFree(nullptr);
    int ok[4] = {0, 0, 0, 0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; i++) threads.emplace_back([&ok, i] { ok[i] = thread_check(i + 1); });
    for (auto &t : threads) t.join();
    printf("threads_ok=%d\n", ok[0] && ok[1] && ok[2] && ok[3]);

    // a graph of kernels, replayed
    const size_t n = 1 << 20;
    float *x, *y;
    cudaMalloc(&x, n * sizeof(float));
    cudaMalloc(&y, n * sizeof(float));
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    fill<<<128, 256, 0, s>>>(x, n, 1.0f);
    fill<<<128, 256, 0, s>>>(y, n, 0.0f);
    cudaGraph_t g;
    cudaGraphExec_t exec;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    axpy<<<128, 256, 0, s>>>(y, x, n, 0.5f);
    axpy<<<128, 256, 0, s>>>(y, x, n, 0.25f);
    cudaError_t e = cudaStreamEndCapture(s, &g);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, g, 0);
    for (int i = 0; i < 100 && e == cudaSuccess; i++) e = cudaGraphLaunch(exec, s);
    cudaStreamSynchronize(s);
    float got = -1;
    cudaMemcpy(&got, y + n / 2, sizeof(float), cudaMemcpyDeviceToHost);
    printf("graph_error=%d\ngraph_value=%g\ngraph_ok=%d\n", (int)e, got, e == cudaSuccess && got == 75.0f);
    cudaFree(x);
    cudaFree(y);

    // past the cap on the per-thread default stream
    std::vector<void *> held;
    size_t taken = 0, chunk = 256 << 20;
    cudaError_t over = cudaSuccess;
    while (taken < cap + chunk) {
        void *p = nullptr;
        over = cudaMallocAsync(&p, chunk, 0);
        if (over != cudaSuccess) break;
        cudaStreamSynchronize(0);
        held.push_back(p);
        taken += chunk;
    }
    cudaGetLastError();
    printf("ptsz_taken=%zu\nptsz_over=%d\n", taken, (int)over);
    for (void *p : held) cudaFreeAsync(p, 0);
    cudaStreamSynchronize(0);
    held.clear();

    // a memory node inside a graph, with three quarters of the cap already taken
    size_t base = cap / 4 * 3;
    void *big = nullptr;
    cudaError_t eb = cudaMalloc(&big, base);
    cudaStream_t c;
    cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking);
    size_t inner = cap / 2;
    cudaGraph_t mg;
    cudaGraphExec_t mexec;
    void *q = nullptr;
    cudaError_t ec = cudaStreamBeginCapture(c, cudaStreamCaptureModeRelaxed);
    cudaError_t ea = cudaMallocAsync(&q, inner, c);
    if (ea == cudaSuccess) {
        fill<<<256, 256, 0, c>>>((float *)q, inner / sizeof(float), 2.0f);
        cudaFreeAsync(q, c);
    }
    cudaError_t ee = cudaStreamEndCapture(c, &mg);
    cudaError_t ei = ee == cudaSuccess ? cudaGraphInstantiate(&mexec, mg, 0) : ee;
    cudaError_t el = ei == cudaSuccess ? cudaGraphLaunch(mexec, c) : ei;
    cudaError_t es = cudaStreamSynchronize(c);
    cudaGetLastError();
    unsigned long long used_high = 0;
    cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &used_high);
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    printf("node_base=%d\nnode_capture_alloc=%d\nnode_instantiate=%d\nnode_launch=%d\nnode_sync=%d\n", (int)eb, (int)ea,
           (int)ei, (int)el, (int)es);
    printf("node_used_high=%llu\nnode_base_bytes=%zu\nnode_inner_bytes=%zu\ncap=%zu\ntotal=%zu\n", used_high, base, inner,
           cap, total_b);
    return 0;
}
