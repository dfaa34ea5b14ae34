/* What fake_cuda.c takes from fake_cuda_runtime.c (see there). */
#pragma once
#include <cuda.h>

CUresult fake_export_table(const void **table, const CUuuid *id);
CUresult fake_unimplemented(void);
CUresult cuCtxGetDevice(CUdevice *dev);
CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version);
CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode *mode);
