// What one client trains on: where its data lives, its format, and which shard is its own.
//
// `DataSpec` is the options struct the client's configuration maps onto. `LoadClientData` turns it
// into a Dataset holding only this client's rows:
//   format "idx", partitioned:   reads the training labels (small), computes the partition (every
//                                client computes the same one from the shared seed), then streams
//                                the image file keeping only this shard's rows.
//   format "idx", unpartitioned: the whole training split of the Fashion-MNIST-style directory.
//   format "csv":                the CSV file at `path` (data/csv.h); if partitioned, the same
//                                partition rules applied to its rows.
//
// Thread-safety: stateless function; safe to call concurrently.
#pragma once

#include <cstdint>
#include <string>

#include "common/config_reader.h"
#include "common/status.h"
#include "data/dataset.h"
#include "data/fashion_mnist.h"
#include "data/partition.h"

namespace huddle::data {

struct DataSpec {
  // "idx": a directory holding train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz.
  // "csv": a CSV file (label first, then features).
  std::string path = kDefaultFashionMnistDir;
  std::string format = "idx";  // idx | csv
  PartitionOptions partition;  // used when `partitioned`
  int64_t shard = 0;           // this client's shard, in [0, partition.num_shards)
  bool partitioned = false;    // false: the client uses every row
  int64_t num_classes = 10;    // labels lie in [0, num_classes)
  bool csv_scale_255 = false;  // csv only: divide features by 255
};

// Loads the rows of `spec` that belong to this client (see above). Errors: InvalidArgument for a
// bad spec (unknown format, shard outside [0, num_shards), ...) and whatever the loaders and
// Partition return.
// A `data:` section of a job or client YAML into *spec (keys path, format, partition, alpha,
// num_classes, scale_255, seed; num_shards and shard when shard_keys). Errors name the key.
Status ReadDataSpec(ConfigMap& m, DataSpec* spec, bool shard_keys);

StatusOr<Dataset> LoadClientData(const DataSpec& spec);

}  // namespace huddle::data
