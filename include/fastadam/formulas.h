/* fastadam/formulas.h -- every optimizer's element formula (the headers optimizers.def lists),
 * instantiated for float (_f32) and double (_f64) compute types (see formula.h).  The includer
 * provides sqrtf, sqrt, fabsf, fabs, copysignf and copysign. */
#ifndef FASTADAM_FORMULAS_H
#define FASTADAM_FORMULAS_H

#define FA_CAT_(a, b) a##b
#define FA_CAT(a, b) FA_CAT_(a, b)

#define FA_C float
#define FA_SQRT sqrtf
#define FA_FABS fabsf
#define FA_COPYSIGN copysignf
#define FA_FN(name) FA_CAT(name, _f32)
#include "fastadam/optimizers.def" /* every formula header */
#undef FA_C
#undef FA_SQRT
#undef FA_FABS
#undef FA_COPYSIGN
#undef FA_FN

#define FA_C double
#define FA_SQRT sqrt
#define FA_FABS fabs
#define FA_COPYSIGN copysign
#define FA_FN(name) FA_CAT(name, _f64)
#include "fastadam/optimizers.def" /* every formula header */
#undef FA_C
#undef FA_SQRT
#undef FA_FABS
#undef FA_COPYSIGN
#undef FA_FN

#endif /* FASTADAM_FORMULAS_H */
