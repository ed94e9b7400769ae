# The part of TF_CONFIG that libpsclient reads, decoded with capnp-json's
# JsonCodec. Keys not named here ("environment", "rpc_layer", other job types)
# are ignored by the codec.
@0xaa743f867a16068c;

$import "/capnp/c++.capnp".namespace("ps::tfconfig");

struct TfConfig {
  cluster @0 :Cluster;
  task @1 :Task;
}

struct Cluster {
  chief @0 :List(Text);
  master @1 :List(Text);   # TF 1.x / early Kubeflow name of the chief
  worker @2 :List(Text);
  ps @3 :List(Text);
  evaluator @4 :List(Text);
}

struct Task {
  type @0 :Text;
  index @1 :Int32 = -1;    # -1: the key was missing
}
