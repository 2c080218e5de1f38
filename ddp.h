/* Umbrella header for libddp: include this from a training program. */
#ifndef DDP_H
#define DDP_H

#include "rendezvous/store.h"
#include "worker/pg.h"

#endif
