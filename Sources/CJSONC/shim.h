#ifndef BACKHAUL_CJSONC_SHIM_H
#define BACKHAUL_CJSONC_SHIM_H
#include <json-c/json.h>
#endif
