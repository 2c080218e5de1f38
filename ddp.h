/* Umbrella header for libddp: include this from a training program. */
#ifndef DDP_H
#define DDP_H

#include "common/err.h"
#include "rendezvous/store.h"
#include "worker/pg.h"
#include "reducer/reducer.h"
#include "pipeline/stage.h"

#endif
