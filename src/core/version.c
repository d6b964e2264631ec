/*
 * version.c - the library's version at run time. The numbers come from the
 * build: CMake passes project()'s version as AK_VERSION_MAJOR, AK_VERSION_MINOR
 * and AK_VERSION_PATCH (cmake/package.cmake), so the version is written once.
 */
#include "attnkit.h"

#if !defined(AK_VERSION_MAJOR) || !defined(AK_VERSION_MINOR) || !defined(AK_VERSION_PATCH)
#error "AK_VERSION_MAJOR, AK_VERSION_MINOR and AK_VERSION_PATCH are defined by the build"
#endif

#define AK_STRINGIFY_(x) #x
#define AK_STRINGIFY(x) AK_STRINGIFY_(x)

int ak_version(void)
{
    return AK_VERSION_MAJOR * 10000 + AK_VERSION_MINOR * 100 + AK_VERSION_PATCH;
}

const char *ak_version_string(void)
{
    return AK_STRINGIFY(AK_VERSION_MAJOR) "." AK_STRINGIFY(AK_VERSION_MINOR) "."
           AK_STRINGIFY(AK_VERSION_PATCH);
}
