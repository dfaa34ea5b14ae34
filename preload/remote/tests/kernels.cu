// Kernels of the remote GPU test programs. On the fake driver a kernel sleeps for the microseconds in
// its first parameter, so each takes that as an unsigned 64-bit value.
extern "C" __global__ void spin(unsigned long long us, float *out, int n) {
    if (out && threadIdx.x == 0) out[0] = (float)n + (float)us;
}
extern "C" __global__ void empty() {}
