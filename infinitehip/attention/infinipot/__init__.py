from infinitehip.attention.infinipot.method import InfiniPotAttention, InfiniPotState

__all__ = ["InfiniPotAttention", "InfiniPotState"]
