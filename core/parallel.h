#pragma once
// Internal spelling of the row-parallel loops for the ops library (detail::parallel_for); the loops
// themselves are public in genbridge/core/threading.h, which code outside the ops library includes.

#include "genbridge/core/threading.h"

namespace genbridge::detail {

using genbridge::parallel_for;
using genbridge::parallel_for_dynamic;

}  // namespace genbridge::detail
